//! Bounds on a JSON schema before llama.cpp turns it into a grammar.
//!
//! The converter's cost grows with the square of an object's optional
//! properties (800 take a second here, 2,500 stall decoding for a minute) and
//! its recursion follows the schema, so one request with a schema of 20,000
//! optional properties overflowed the engine thread's stack and took the
//! whole process down. Every schema a request brings (`response_format`,
//! each tool's `parameters`) is checked here first, and a schema past a
//! bound is a 400 that names it. The walk is iterative: checking a hostile
//! schema must not itself recurse on it.

use serde_json::Value;

/// Largest schema, serialized.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Deepest nesting of JSON objects and arrays in a schema.
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// Most properties one object of a schema may declare.
pub const MAX_OBJECT_PROPERTIES: usize = 128;
/// Most properties a whole schema may declare.
pub const MAX_SCHEMA_PROPERTIES: usize = 2048;
/// Most values one `enum` may list.
pub const MAX_ENUM_VALUES: usize = 1024;

/// Checks `schema` against every bound; the error is the rest of a sentence
/// that starts with the schema's name ("has 129 properties in one object…").
pub fn check(schema: &Value) -> Result<(), String> {
    let bytes = serde_json::to_vec(schema).map(|b| b.len()).unwrap_or(usize::MAX);
    if bytes > MAX_SCHEMA_BYTES {
        return Err(format!("is {bytes} bytes; a schema may have at most {MAX_SCHEMA_BYTES}"));
    }
    let mut total_properties = 0usize;
    let mut stack: Vec<(&Value, usize)> = vec![(schema, 1)];
    while let Some((value, depth)) = stack.pop() {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(format!("nests deeper than {MAX_SCHEMA_DEPTH} levels"));
        }
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    if properties.len() > MAX_OBJECT_PROPERTIES {
                        return Err(format!(
                            "has {} properties in one object; at most {MAX_OBJECT_PROPERTIES} are allowed",
                            properties.len()
                        ));
                    }
                    total_properties += properties.len();
                    if total_properties > MAX_SCHEMA_PROPERTIES {
                        return Err(format!("declares more than {MAX_SCHEMA_PROPERTIES} properties in all"));
                    }
                }
                if let Some(Value::Array(values)) = map.get("enum") {
                    if values.len() > MAX_ENUM_VALUES {
                        return Err(format!(
                            "has an enum of {} values; at most {MAX_ENUM_VALUES} are allowed",
                            values.len()
                        ));
                    }
                }
                stack.extend(map.values().map(|v| (v, depth + 1)));
            }
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, depth + 1))),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object_with(n: usize) -> Value {
        let properties: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
        json!({"type": "object", "properties": properties})
    }

    fn nested(levels: usize) -> Value {
        // Each level adds two JSON levels: the object and its "properties".
        let mut schema = json!({"type": "string"});
        for _ in 0..levels {
            schema = json!({"properties": {"a": schema}});
        }
        schema
    }

    #[test]
    fn properties_per_object_at_and_past() {
        assert_eq!(check(&object_with(MAX_OBJECT_PROPERTIES)), Ok(()));
        assert!(check(&object_with(MAX_OBJECT_PROPERTIES + 1)).unwrap_err().contains("129 properties in one object"));
    }

    #[test]
    fn properties_in_all_at_and_past() {
        let per = MAX_OBJECT_PROPERTIES;
        let branches = |total: usize| {
            let mut items: Vec<Value> = (0..total / per).map(|_| object_with(per)).collect();
            if !total.is_multiple_of(per) {
                items.push(object_with(total % per));
            }
            json!({"anyOf": items})
        };
        assert_eq!(check(&branches(MAX_SCHEMA_PROPERTIES)), Ok(()));
        assert!(check(&branches(MAX_SCHEMA_PROPERTIES + 1)).unwrap_err().contains("more than 2048 properties"));
    }

    #[test]
    fn depth_at_and_past() {
        // The innermost string schema is one level; each wrapper adds two.
        let at = nested((MAX_SCHEMA_DEPTH - 1) / 2);
        assert_eq!(check(&at), Ok(()));
        let past = json!({"x": nested((MAX_SCHEMA_DEPTH - 1) / 2)});
        assert!(check(&past).unwrap_err().contains("deeper than 32"));
    }

    #[test]
    fn enum_values_at_and_past() {
        let values = |n: usize| json!({"enum": (0..n).collect::<Vec<_>>()});
        assert_eq!(check(&values(MAX_ENUM_VALUES)), Ok(()));
        assert!(check(&values(MAX_ENUM_VALUES + 1)).unwrap_err().contains("enum of 1025 values"));
    }

    #[test]
    fn bytes_at_and_past() {
        // A description padded to the byte budget exactly, then one past.
        let base = json!({"description": ""}).to_string().len();
        let at = json!({"description": "x".repeat(MAX_SCHEMA_BYTES - base)});
        assert_eq!(check(&at), Ok(()));
        let past = json!({"description": "x".repeat(MAX_SCHEMA_BYTES - base + 1)});
        assert!(check(&past).unwrap_err().contains("at most 262144"));
    }
}
