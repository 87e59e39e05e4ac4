"""The bundled skills' own tools, run for real."""

import subprocess
import sys

import pytest

from conftest import ROOT

VALIDATOR = ROOT / "skills" / "skill-authoring" / "scripts" / "validate_skill.py"
FIXTURES = ROOT.parent / "shared" / "fixtures" / "published-skills"


def validate(*args):
    return subprocess.run([sys.executable, str(VALIDATOR), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_bundled_skills_pass_the_validator_strictly():
    result = validate("--strict", ROOT / "skills" / "skill-authoring", ROOT / "skills" / "skillhost-api")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"OK: {ROOT / 'skills' / 'skill-authoring'}",
        f"OK: {ROOT / 'skills' / 'skillhost-api'}",
    ]


def test_published_skills_pass_the_validator():
    folders = sorted(p for p in FIXTURES.iterdir() if p.is_dir())
    result = validate(*folders)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("ERROR")] == []


def test_the_validator_reports_broken_skills(tmp_path):
    skill = tmp_path / "Bad_Name"
    skill.mkdir()
    (skill / "SKILL.md").write_text("---\nname: Bad_Name\n---\nSee ../secret.md\n")
    result = validate(skill)
    assert result.returncode == 1
    errors = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    assert any("description" in line for line in errors), result.stdout
    assert any("name" in line for line in errors), result.stdout


# The keys Claude Code's SKILL.md adds, which the loader reads: (frontmatter
# lines, the warnings the validator gives). A value of the wrong type is a
# warning, as the loader ignores it with one (actors/src/skills/manifest.rs).
GOVERNANCE_CASES = [
    ("disable-model-invocation: true\n", []),
    ("disable-model-invocation: sometimes\n", ["disable-model-invocation is not true or false; skillhost ignores it and uses false"]),
    ("user-invocable: false\n", []),
    ("user-invocable: [1]\n", ["user-invocable is not true or false; skillhost ignores it and uses true"]),
    ('argument-hint: "[file] [format]"\n', []),
    # Unquoted, the brackets make a YAML list.
    ("argument-hint: [file]\n", [
        "argument-hint is not text; skillhost ignores it. Write it as one string, such as 'argument-hint: \"[file] [format]\"'"
    ]),
    ("allowed-tools: Bash(git:*) Read\n", []),
    ("allowed-tools: {Read: yes}\n", [
        "allowed-tools is neither a space-separated string nor a list of tool names; skillhost ignores it"
    ]),
    ("model: claude-opus-4\n", [
        "model 'claude-opus-4' does not apply in skillhost, which runs one model for every skill; "
        "remove the key unless another client needs it"
    ]),
    ("model: [a, b]\n", ["model is not text; skillhost ignores it"]),
]


@pytest.mark.parametrize("parser", [[], ["--builtin-parser"]], ids=["pyyaml", "builtin"])
@pytest.mark.parametrize("frontmatter,warnings", GOVERNANCE_CASES)
def test_the_validator_reads_the_governance_keys_as_the_loader_does(tmp_path, parser, frontmatter, warnings):
    skill = tmp_path / "deploy"
    skill.mkdir()
    (skill / "SKILL.md").write_text(
        "---\nname: deploy\ndescription: Ships the service to production. Use when asked to deploy.\n"
        + frontmatter
        + "---\nRun the deploy.\n"
    )
    result = validate(*parser, skill)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"WARNING: {skill}: {w}" for w in warnings] + [f"OK: {skill}"]


def test_the_check_script_reports_an_unreachable_server():
    script = ROOT / "skills" / "skillhost-api" / "scripts" / "skillhost_check.py"
    # Port 9 (discard) on loopback: nothing answers.
    result = subprocess.run([sys.executable, str(script), "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr


def test_the_check_script_against_the_real_server(server):
    script = ROOT / "skills" / "skillhost-api" / "scripts" / "skillhost_check.py"
    result = subprocess.run([sys.executable, str(script), server.url], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SmolLM2-135M-Instruct.Q4_1" in result.stdout
