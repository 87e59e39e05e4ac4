"""The deployment files under deploy/: the systemd unit passes systemd's own
check, the Containerfile is well formed and never takes a model into the
image, and the container's config loads in the real binary."""

import io
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from conftest import BINARY, ROOT

UNIT = ROOT / "deploy" / "skillhost.service"
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
CONTAINER_CONFIG = ROOT / "deploy" / "container.yaml"
CONTAINERIGNORE = ROOT / ".containerignore"

INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL",
    "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}


def unit_settings(text):
    """`Key=value` lines of a unit file as {key: [values]}, comments left out."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_unit_file_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    # verify checks that ExecStart's binary exists; point it at one that does.
    binary = BINARY if BINARY.exists() else Path("/bin/true")
    text = UNIT.read_text()
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace("/usr/local/bin/skillhost", str(binary)))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    print(output)
    assert result.returncode == 0, output
    assert [line for line in output.splitlines() if UNIT.name in line] == [], output

    settings = unit_settings(text)
    assert any("HUP" in value and "$MAINPID" in value for value in settings["ExecReload"]), settings
    assert settings["Delegate"] == ["yes"]
    assert "skillhost" in " ".join(settings["StateDirectory"]).split()
    assert "RestrictNamespaces" not in settings
    assert "yes" not in settings.get("ProtectControlGroups", [])
    # These mount over parts of /proc, after which the sandbox cannot mount
    # its own /proc in a user namespace ("sandboxing failure: Operation not
    # permitted" for every command).
    for over_proc in ("ProtectKernelLogs", "ProtectKernelTunables", "ProtectHostname", "ProcSubset"):
        assert over_proc not in settings, over_proc


def containerfile_instructions():
    parser = DockerfileParser(fileobj=io.BytesIO(CONTAINERFILE.read_bytes()), env_replace=False)
    return [item for item in parser.structure if item["instruction"] != "COMMENT"]


def copy_parts(value):
    """(options, sources, destination) of a COPY or ADD in shell form."""
    words = value.split()
    options = [word for word in words if word.startswith("--")]
    paths = [word for word in words if not word.startswith("--")]
    return options, paths[:-1], paths[-1]


def test_containerfile_parses():
    instructions = containerfile_instructions()
    assert {item["instruction"] for item in instructions} <= INSTRUCTIONS, instructions

    stages = []
    copied_from_context = []
    for item in instructions:
        name, value = item["instruction"], item["value"]
        if name == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", value, re.IGNORECASE)
            assert match, f"every stage is named: {value}"
            stages.append(match.group(2))
            continue
        if name in ("COPY", "ADD"):
            options, sources, _ = copy_parts(value)
            assert sources, value
            stage_options = [option for option in options if option.startswith("--from=")]
            for option in stage_options:
                assert option.removeprefix("--from=") in stages[:-1], f"{value}: not an earlier stage"
            if name == "ADD":
                assert not any(re.match(r"[a-z]+://", source) for source in sources), value
            if not stage_options:
                copied_from_context += sources
            if stages[-1] == "runtime":
                for source in sources:
                    assert "models" not in Path(source).parts and not source.endswith(".gguf"), value
        if name in ("ENTRYPOINT", "CMD"):
            form = json.loads(value)
            assert isinstance(form, list) and all(isinstance(word, str) for word in form), value
        if name == "HEALTHCHECK":
            json.loads(value.split("CMD", 1)[1])
    assert stages == ["build", "runtime"]

    ignored = [line.rstrip("/") for line in CONTAINERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    for source in copied_from_context:
        assert (ROOT / source).exists(), f"the Containerfile copies {source}, which the repository lacks"
        assert not any(Path(source).parts[: len(Path(pattern).parts)] == Path(pattern).parts for pattern in ignored), (
            f"{source} is excluded by .containerignore"
        )


def container_config():
    """Top-level keys of deploy/container.yaml; lists as Python lists. The file
    is flat, so this small reader is total for it."""
    config, key = {}, None
    for line in CONTAINER_CONFIG.read_text().splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line:
            continue
        item = re.fullmatch(r"\s+-\s+(\S+)", line)
        if item:
            config[key].append(item.group(1))
            continue
        key, _, value = line.partition(":")
        config[key] = value.strip() or []
    return config


def test_the_image_provides_every_path_the_container_config_names():
    config = container_config()
    copies = {}
    volumes = []
    for item in containerfile_instructions():
        if item["instruction"] == "COPY" and "--from=" not in item["value"]:
            _, sources, destination = copy_parts(item["value"])
            copies[destination.rstrip("/")] = sources
        if item["instruction"] == "VOLUME":
            volumes += json.loads(item["value"])
    assert copies["/etc/skillhost/skillhost.yaml"] == ["deploy/container.yaml"]
    for root in config["skills-dir"]:
        assert root in copies, f"skills-dir {root} is not in the image"
    for key in ("model", "skills-install-dir", "workspace-dir"):
        assert any(config[key].startswith(volume + "/") for volume in volumes), f"{key} is not on a volume"


def serve_print_config(*args, **env):
    if not BINARY.exists():
        pytest.skip(f"{BINARY} is missing: run `cargo build --release`")
    clean = {name: value for name, value in os.environ.items() if not name.startswith("SKILLHOST_")}
    return subprocess.run(
        [str(BINARY), "serve", "--config", str(CONTAINER_CONFIG), "--print-config", *args],
        capture_output=True, text=True, timeout=60, env={**clean, **env},
    )


def test_the_container_config_loads_in_the_real_binary():
    # The image's copy of skills/ lives at /usr/share/skillhost/skills; here
    # the repository's own folder stands in for it.
    skills = {"SKILLHOST_SKILLS_DIR": str(ROOT / "skills")}
    result = serve_print_config("--api-key", "k", **skills)
    assert re.search(r"^host: 0\.0\.0\.0 .*container\.yaml", result.stdout, re.MULTILINE), result.stdout
    # The file parsed; what is left is the model, which is mounted at run time.
    assert "not a valid config" not in result.stderr and "unknown key" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --model:") and "/models/model.gguf" in errors[0], (
        result.stderr
    )
    assert result.returncode == 2

    with tempfile.NamedTemporaryFile(suffix=".gguf") as model:
        mounted = {**skills, "SKILLHOST_MODEL": model.name}
        accepted = serve_print_config("--api-key", "k", **mounted)
        assert (accepted.returncode, accepted.stderr) == (0, ""), accepted.stderr
        # What container.yaml's comment says: a public address needs a key.
        refused = serve_print_config(**mounted)
        assert refused.returncode == 2 and "no key" in refused.stderr, refused.stderr
