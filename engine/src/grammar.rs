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
    fn literal_escapes() {
        assert_eq!(literal("<tool_call>\n\"x\"\\"), "\"<tool_call>\\n\\\"x\\\"\\\\\"");
    }
}
