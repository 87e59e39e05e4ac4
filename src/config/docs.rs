//! The flag reference in `docs/configuration.md` and the documented example
//! `config/skillhost.yaml`, kept true to clap's definitions of `serve`: the
//! table is generated from them (`UPDATE_DOCS=1` rewrites it), and every
//! setting must appear in the example file under its key with its variable.

use clap::{Arg, Command};

/// Where the generated table sits in `docs/configuration.md`.
const BEGIN: &str = "<!-- serve-flags:begin";
const END: &str = "<!-- serve-flags:end -->";

/// The flags of `serve` a user sets, in the order `serve --help` shows them:
/// by heading, then as defined. The generated negations stay out.
fn documented(serve: &Command) -> Vec<(&str, Vec<&Arg>)> {
    let mut groups: Vec<(&str, Vec<&Arg>)> = Vec::new();
    for arg in
        serve.get_arguments().filter(|arg| !arg.is_hide_set() && arg.get_long().is_some() && arg.get_id() != "help")
    {
        let heading = arg.get_help_heading().unwrap_or("Other");
        match groups.iter_mut().find(|(name, _)| *name == heading) {
            Some((_, args)) => args.push(arg),
            None => groups.push((heading, vec![arg])),
        }
    }
    groups
}

/// A table cell: one line, with the table's separator escaped.
fn cell(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The flag table, one section per heading.
pub fn flag_table(serve: &Command) -> String {
    let mut out = String::new();
    for (heading, args) in documented(serve) {
        out.push_str(&format!("\n### {heading}\n\n| Flag | Variable | What it sets |\n|---|---|---|\n"));
        for arg in args {
            let long = arg.get_long().unwrap_or_default();
            let flag = match arg.get_short() {
                Some(short) => format!("`--{long}`, `-{short}`"),
                None => format!("`--{long}`"),
            };
            let env = arg.get_env().map_or(String::new(), |env| format!("`{}`", env.to_string_lossy()));
            let help = arg.get_help().map(|help| cell(&help.to_string())).unwrap_or_default();
            out.push_str(&format!("| {flag} | {env} | {help} |\n"));
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::path::PathBuf;

    fn serve() -> Command {
        let mut root = crate::config::command();
        root.build();
        root.find_subcommand("serve").cloned().expect("the serve subcommand")
    }

    fn repository_file(path: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
    }

    #[test]
    fn the_flag_table_in_the_docs_is_clap_s() {
        let path = repository_file("docs/configuration.md");
        let text = std::fs::read_to_string(&path).expect("docs/configuration.md");
        let begin = text.find(BEGIN).expect("the serve-flags:begin marker");
        let begin = begin + text[begin..].find('\n').expect("a line after the marker") + 1;
        let end = text.find(END).expect("the serve-flags:end marker");
        let table = flag_table(&serve());
        if std::env::var_os("UPDATE_DOCS").is_some() {
            let updated = format!("{}{table}{}", &text[..begin], &text[end..]);
            std::fs::write(&path, updated).expect("docs/configuration.md is writable");
            return;
        }
        assert_eq!(&text[begin..end], table, "run UPDATE_DOCS=1 cargo test --release --workspace --bins config::docs");
    }

    #[test]
    fn every_setting_is_in_the_example_config_with_its_variable() {
        let example = std::fs::read_to_string(repository_file("config/skillhost.yaml")).expect("the example config");
        let mut missing = Vec::new();
        for (_, args) in documented(&serve()) {
            for arg in args {
                let long = arg.get_long().unwrap_or_default();
                if ["config", "list-skills", "print-config"].contains(&long) {
                    // They steer the command and have no key.
                    continue;
                }
                // The one key named apart from its flag: a list of upstreams.
                let key = if long == "upstream" { "upstreams:".to_string() } else { format!("{long}:") };
                let line = example.lines().find(|line| line.trim_start_matches(['#', ' ']).starts_with(&key));
                let env = arg.get_env().map(|env| env.to_string_lossy().into_owned());
                match (line, env) {
                    (None, _) => missing.push(format!("no key {key}")),
                    (Some(line), Some(env)) if !line.contains(&format!("--{long}")) || !line.contains(&env) => {
                        missing.push(format!("{key} does not name --{long} and {env}: {line}"))
                    }
                    _ => {}
                }
            }
        }
        assert_eq!(missing, Vec::<String>::new());
    }

    #[test]
    fn every_serve_flag_has_a_heading() {
        let loose: Vec<String> = documented(&serve())
            .into_iter()
            .filter(|(heading, _)| *heading == "Other")
            .flat_map(|(_, args)| args.into_iter().map(|a| a.get_id().to_string()))
            .collect();
        assert_eq!(loose, Vec::<String>::new());
    }
}
