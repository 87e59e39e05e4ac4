//! One precedence for every setting and every type, through the real
//! binary: flag > SKILLHOST_* variable > later --config file > earlier
//! file > default, read back with `serve --print-config`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_skillhost");

/// `(value, origin)` per key as `--print-config` shows it.
fn effective(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<(String, String, String)> {
    let mut command = Command::new(BINARY);
    command.arg("serve").args(args).arg("--print-config").current_dir(dir);
    // Only the variables a case sets: none leak in from the test's own environment.
    for (name, _) in std::env::vars() {
        if name.starts_with("SKILLHOST_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{args:?} {env:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (key, rest) = line.split_once(": ")?;
            let (value, origin) = rest.split_once("  # from ")?;
            Some((key.to_string(), value.to_string(), origin.to_string()))
        })
        .collect()
}

fn value_of(settings: &[(String, String, String)], key: &str) -> Option<(String, String)> {
    settings.iter().find(|(k, _, _)| k == key).map(|(_, v, o)| (v.clone(), o.clone()))
}

#[test]
fn every_pair_of_layers_for_a_switch_a_number_a_path_and_a_list() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("m.gguf"), b"").unwrap();
    for sub in ["w1", "w2", "w3", "w4", "s1", "s2", "s3", "s4", "s5"] {
        std::fs::create_dir(d.join(sub)).unwrap();
    }
    std::fs::write(
        d.join("one.yaml"),
        "model: m.gguf\ncode-exec-unconfined: true\nport: 6001\nworkspace-dir: w1\nskills-dir: [s1, s2]\n",
    )
    .unwrap();
    std::fs::write(
        d.join("two.yaml"),
        "code-exec-unconfined: false\nport: 6002\nworkspace-dir: w2\nskills-dir: [s3]\n",
    )
    .unwrap();
    let one = ["--config", "one.yaml"];
    let both = ["--config", "one.yaml", "--config", "two.yaml"];
    let env = [
        ("SKILLHOST_CODE_EXEC_UNCONFINED", "true"),
        ("SKILLHOST_PORT", "6003"),
        ("SKILLHOST_WORKSPACE_DIR", "w3"),
        ("SKILLHOST_SKILLS_DIR", "s4:s5"),
    ];
    let flags = ["--no-code-exec-unconfined", "--port", "6004", "--workspace-dir", "w4", "--skills-dir", "s5"];
    // The files sit in the working directory and are named relative to it,
    // so their paths (and the paths inside them) print as given.
    let file = |name: &str| name.to_string();
    let rows: Vec<(&str, [(&str, &str); 4])> = vec![
        ("code-exec-unconfined", [("true", "one"), ("false", "two"), ("true", "env"), ("false", "flag")]),
        ("port", [("6001", "one"), ("6002", "two"), ("6003", "env"), ("6004", "flag")]),
        ("workspace-dir", [("w1", "one"), ("w2", "two"), ("w3", "env"), ("w4", "flag")]),
        ("skills-dir", [("[s1, s2]", "one"), ("[s3]", "two"), ("[s4, s5]", "env"), ("[s5]", "flag")]),
    ];
    let layers: [Vec<(String, String, String)>; 4] = [
        effective(d, &one, &[]),
        effective(d, &both, &[]),
        effective(d, &both, &env),
        effective(d, &[&both[..], &flags[..]].concat(), &env),
    ];
    for (key, expected) in rows {
        for (layer, (value, source)) in expected.iter().enumerate() {
            let (shown, origin) =
                value_of(&layers[layer], key).unwrap_or_else(|| panic!("{key} unset at layer {layer}"));
            // Paths from files are relative to the file; from flags and
            // variables, to the working directory.
            let want = match (key, *source) {
                ("workspace-dir", "one" | "two") => file(value),
                ("skills-dir", "one" | "two") => {
                    let inner: Vec<String> = value.trim_matches(['[', ']']).split(", ").map(file).collect();
                    format!("[{}]", inner.join(", "))
                }
                _ => value.to_string(),
            };
            assert_eq!(shown, want, "{key} at layer {layer}");
            let want_origin = match *source {
                "one" => file("one.yaml"),
                "two" => file("two.yaml"),
                "env" => format!(
                    "${}",
                    env.iter().find(|(n, _)| n.ends_with(&key.replace('-', "_").to_uppercase())).unwrap().0
                ),
                _ => "the command line".to_string(),
            };
            assert_eq!(origin.replace("'", ""), want_origin, "{key} at layer {layer}");
        }
    }
    // Unset keys fall back to their defaults.
    let bare = effective(d, &["--model", "m.gguf"], &[]);
    assert_eq!(value_of(&bare, "port"), None);
    assert_eq!(value_of(&bare, "model"), Some(("[m.gguf]".into(), "the command line".into())));
}

#[test]
fn a_switch_turned_on_anywhere_can_be_turned_off_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("m.gguf"), b"").unwrap();
    std::fs::write(d.join("on.yaml"), "model: m.gguf\ncode-exec: true\n").unwrap();
    let on = ["--config", "on.yaml"];
    let get = |args: &[&str], env: &[(&str, &str)]| value_of(&effective(d, args, env), "code-exec").unwrap().0;
    assert_eq!(get(&on, &[]), "true");
    // A variable turns off a file's true, in every spelling clap accepts.
    for off in ["false", "0", "no", "off"] {
        assert_eq!(get(&on, &[("SKILLHOST_CODE_EXEC", off)]), "false", "{off}");
    }
    assert_eq!(get(&[&on[..], &["--no-code-exec"]].concat(), &[]), "false");
    assert_eq!(get(&[&on[..], &["--no-code-exec"]].concat(), &[("SKILLHOST_CODE_EXEC", "1")]), "false");
    // The last of --x / --no-x on the command line wins.
    assert_eq!(get(&[&on[..], &["--no-code-exec", "--code-exec"]].concat(), &[]), "true");
    // And on again above a file's false.
    std::fs::write(d.join("off.yaml"), "model: m.gguf\ncode-exec: false\n").unwrap();
    assert_eq!(get(&["--config", "off.yaml"], &[("SKILLHOST_CODE_EXEC", "yes")]), "true");
}

#[test]
fn print_config_hides_keys_and_checks_what_it_prints() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("m.gguf"), b"").unwrap();
    let settings = effective(d, &["--model", "m.gguf", "--api-key", "sk-secret-1", "--metrics-key", "mk"], &[]);
    let (shown, _) = value_of(&settings, "api-key").unwrap();
    assert!(!shown.contains("sk-secret"), "{shown}");
    assert!(!value_of(&settings, "metrics-key").unwrap().0.contains("mk"));
    // A bad setting is printed, then named, and the exit status says so.
    let output = Command::new(BINARY)
        .args(["serve", "--model", "missing.gguf", "--print-config"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--model: the model file"));
}
