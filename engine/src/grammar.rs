//! Turning a [`GrammarSpec`] into GBNF with llama.cpp's JSON-schema converter.
//! Runs on a thread of its own with a deep stack (`engine::convert_grammar`).

use crate::error::EngineError;
use crate::format::GrammarSpec;
use crate::sampling::CompiledGrammar;

/// Rule names of our wrapper; the converter names its rules after schema
/// property names, so ours carry a prefix no schema uses.
const CALLS_RULE: &str = "skillhost-values";

/// Most values (tool calls) one constrained reply may hold. A small model held
/// to a "one or more calls" grammar can repeat the same call until the context
/// is full; eight covers real parallel calls and bounds the runaway case.
pub const MAX_REPEATED_VALUES: usize = 8;

pub fn compile(spec: &GrammarSpec) -> Result<CompiledGrammar, EngineError> {
    let schema = spec.schema.to_string();
    let converted = llama_cpp_2::json_schema_to_grammar(&schema).map_err(|err| {
        EngineError::InvalidGrammar(format!("the JSON schema cannot be turned into a grammar ({err})"))
    })?;
    if spec.open.is_empty() && spec.close.is_empty() && !spec.repeat && spec.trigger.is_none() {
        return Ok(CompiledGrammar { gbnf: converted, root: "root".into(), trigger: None });
    }
    let more = if spec.repeat {
        format!(" ({} root){{0,{}}}", literal(&spec.separator), MAX_REPEATED_VALUES - 1)
    } else {
        String::new()
    };
    let gbnf = format!("{converted}\n{CALLS_RULE} ::= {} root{more} {}\n", literal(&spec.open), literal(&spec.close));
    Ok(CompiledGrammar { gbnf, root: CALLS_RULE.into(), trigger: spec.trigger.clone() })
}

/// The grammar with its start rule named `root`, as servers that take GBNF
/// in a request (llama-server) expect: the value rule the converter named
/// `root` is renamed, and the calls rule becomes `root`.
pub(crate) fn rooted(grammar: &CompiledGrammar) -> String {
    if grammar.root == "root" {
        return grammar.gbnf.clone();
    }
    rename_rule(&rename_rule(&grammar.gbnf, "root", VALUE_RULE), &grammar.root, "root")
}

/// The value rule's name once the calls rule takes `root`.
const VALUE_RULE: &str = "skillhost-value";

/// Renames every use of the rule `from` (a whole rule name, outside string
/// literals and character classes) to `to`.
fn rename_rule(gbnf: &str, from: &str, to: &str) -> String {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let mut out = String::with_capacity(gbnf.len());
    let mut chars = gbnf.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        match c {
            '"' | '[' => {
                let close = if c == '"' { '"' } else { ']' };
                out.push(c);
                while let Some((_, d)) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some((_, escaped)) = chars.next() {
                            out.push(escaped);
                        }
                    } else if d == close {
                        break;
                    }
                }
            }
            c if is_name(c) => {
                let mut end = start + c.len_utf8();
                while let Some(&(i, d)) = chars.peek() {
                    if !is_name(d) {
                        break;
                    }
                    end = i + d.len_utf8();
                    chars.next();
                }
                let word = &gbnf[start..end];
                out.push_str(if word == from { to } else { word });
            }
            c => out.push(c),
        }
    }
    out
}

/// A GBNF string literal for `text`.
fn literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooted_renames_whole_rule_names_outside_literals() {
        let grammar = CompiledGrammar {
            gbnf: "root ::= \"{\" root-name \"root\" [root] \"}\"\nroot-name ::= \"x\"\nskillhost-values ::= \"<a>\" root \"</a>\"\n".into(),
            root: CALLS_RULE.into(),
            trigger: None,
        };
        assert_eq!(
            rooted(&grammar),
            "skillhost-value ::= \"{\" root-name \"root\" [root] \"}\"\nroot-name ::= \"x\"\nroot ::= \"<a>\" skillhost-value \"</a>\"\n"
        );
    }

    #[test]
    fn literal_escapes() {
        assert_eq!(literal("<tool_call>\n\"x\"\\"), "\"<tool_call>\\n\\\"x\\\"\\\\\"");
    }
}
