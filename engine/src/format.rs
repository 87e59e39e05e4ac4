//! From a conversation to the exact prompt text, the output constraint and the
//! parser for one model: everything model-specific about a chat request.

use serde_json::{json, Value};

use std::sync::Arc;

use crate::chat::{ChatMessage, ChatPayload, ResponseFormat, Role, ToolChoice, ToolDef};
use crate::template::{ChatTemplate, TemplateError, TemplateSource};
use crate::tool_calls::ToolFamily;

/// What a model can do with tools, decided once when it loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub template: TemplateSource,
    /// The syntax its tool calls are read in.
    pub tool_family: ToolFamily,
    /// The chat template renders tool declarations itself. When false, tools
    /// are described in the system message and calls are held to a grammar.
    pub template_declares_tools: bool,
    /// Tools can be offered at all: false for a base model on the plain format,
    /// which has no notion of turns to put a call in.
    pub tools: bool,
}

/// Inspects a template and decides the tool path for its model.
pub fn capabilities(template: &ChatTemplate) -> Capabilities {
    let text = template.text();
    let family = if text.contains("<tool_call>") {
        ToolFamily::Hermes
    } else if text.contains("[TOOL_CALLS]") {
        ToolFamily::Mistral
    } else if text.contains("<|python_tag|>") || text.contains("ipython") {
        ToolFamily::Llama3
    } else {
        ToolFamily::Generic
    };
    let declares =
        *template.source() == TemplateSource::Gguf && family != ToolFamily::Generic && text.contains("tools");
    Capabilities {
        template: template.source().clone(),
        // A family we know but whose template cannot declare tools still gets
        // the generic prompt, which asks for Hermes tags.
        tool_family: if declares { family } else { ToolFamily::Generic },
        template_declares_tools: declares,
        tools: *template.source() != TemplateSource::Plain,
    }
}

/// Whether a prepared prompt carries the conversation as data as well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passing {
    /// Only the rendered text (the local engine, completion upstreams).
    Text,
    /// The text and the conversation: some upstreams render for themselves.
    Both,
    /// Only the conversation: every upstream renders for itself.
    Conversation,
}

/// A chat request as the model-specific layer needs it.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    pub messages: &'a [ChatMessage],
    pub tools: &'a [ToolDef],
    pub tool_choice: &'a ToolChoice,
    pub parallel_tool_calls: bool,
    pub response_format: &'a ResponseFormat,
}

/// A grammar described as data; the engine thread turns it into GBNF with
/// llama.cpp's JSON-schema converter.
///
/// The output must be `open`, then one value matching `schema`, then (when
/// `repeat`) any number of `separator` + value, then `close`.
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarSpec {
    pub schema: Value,
    pub open: String,
    pub separator: String,
    pub close: String,
    pub repeat: bool,
    /// Lazy grammar: free text until this word appears, constrained from it on.
    /// `open` starts with it.
    pub trigger: Option<String>,
}

/// Everything the engine needs to run one conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedPrompt {
    pub text: String,
    pub grammar: Option<GrammarSpec>,
    /// Stop strings the format needs.
    pub stops: Vec<String>,
    /// The parser for tool calls, when tools are in play.
    pub tool_family: Option<ToolFamily>,
    /// The round's conversation as data, for an upstream in chat mode.
    pub chat: Option<Arc<ChatPayload>>,
}

/// Why a conversation cannot be turned into a prompt. All are the caller's fault.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// `tool_choice` names a tool that is not declared.
    #[error("tool_choice names the tool '{0}', which is not in 'tools'")]
    UnknownTool(String),
    /// `tool_choice` requires a call but no tools are declared.
    #[error("tool_choice '{0}' needs at least one tool in 'tools'")]
    NoTools(&'static str),
    /// The model cannot be offered tools.
    #[error("this model has no chat template, so it cannot be offered tools")]
    ToolsUnsupported,
    /// The chat template refused the conversation.
    #[error("the model's chat template rejected the conversation: {0}")]
    Template(#[from] TemplateError),
    /// The grammar's schema (tools and response format together) is past a
    /// bound of [`crate::schema_limits`].
    #[error("the tools' and response format's schema {0}")]
    SchemaTooLarge(String),
}

/// A model's chat template plus the tool path chosen for it.
#[derive(Debug)]
pub struct ChatFormat {
    template: ChatTemplate,
    capabilities: Capabilities,
    passing: Passing,
}

impl ChatFormat {
    pub fn new(template: ChatTemplate) -> Self {
        let capabilities = capabilities(&template);
        ChatFormat { template, capabilities, passing: Passing::Text }
    }

    /// The format of a fleet of chat-mode upstreams: nothing is rendered
    /// here, and tool calls come back as data.
    pub fn upstream_chat() -> Result<Self, TemplateError> {
        let template = ChatTemplate::upstream()?;
        let capabilities = Capabilities {
            template: TemplateSource::Upstream,
            tool_family: ToolFamily::Generic,
            template_declares_tools: true,
            tools: true,
        };
        Ok(ChatFormat { template, capabilities, passing: Passing::Conversation })
    }

    /// This format, with the conversation attached to every prompt (a fleet
    /// that mixes completion and chat upstreams).
    pub fn passing_conversation(mut self) -> Self {
        self.passing = Passing::Both;
        self
    }

    pub fn passing(&self) -> Passing {
        self.passing
    }

    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Renders the prompt and chooses the constraint and parser.
    pub fn prepare(&self, conversation: &Conversation<'_>) -> Result<PreparedPrompt, FormatError> {
        let chat = (self.passing != Passing::Text).then(|| {
            Arc::new(ChatPayload {
                messages: conversation.messages.to_vec(),
                tools: if *conversation.tool_choice == ToolChoice::None {
                    Vec::new()
                } else {
                    conversation.tools.to_vec()
                },
                tool_choice: conversation.tool_choice.clone(),
                parallel_tool_calls: one_call_or_more(conversation),
                response_format: conversation.response_format.clone(),
            })
        });
        if self.passing == Passing::Conversation {
            if let ToolChoice::Named(name) = conversation.tool_choice {
                if !conversation.tools.iter().any(|t| &t.name == name) {
                    return Err(FormatError::UnknownTool(name.clone()));
                }
            }
            if matches!(conversation.tool_choice, ToolChoice::Required) && conversation.tools.is_empty() {
                return Err(FormatError::NoTools("required"));
            }
            return Ok(PreparedPrompt {
                text: String::new(),
                grammar: None,
                stops: Vec::new(),
                tool_family: None,
                chat,
            });
        }
        let mut prepared = self.prepare_text(conversation)?;
        prepared.chat = chat;
        Ok(prepared)
    }

    fn prepare_text(&self, conversation: &Conversation<'_>) -> Result<PreparedPrompt, FormatError> {
        let tools_active = match conversation.tool_choice {
            ToolChoice::None => false,
            ToolChoice::Auto => !conversation.tools.is_empty(),
            ToolChoice::Required if conversation.tools.is_empty() => return Err(FormatError::NoTools("required")),
            ToolChoice::Required => true,
            ToolChoice::Named(name) => {
                if !conversation.tools.iter().any(|t| &t.name == name) {
                    return Err(FormatError::UnknownTool(name.clone()));
                }
                true
            }
        };
        if tools_active && !self.capabilities.tools {
            return Err(FormatError::ToolsUnsupported);
        }
        let family = self.capabilities.tool_family;
        let native = self.capabilities.template_declares_tools;
        let messages = if native {
            template_messages(conversation.messages)
        } else {
            let tools = if tools_active { conversation.tools } else { &[] };
            generic_messages(conversation.messages, tools)
        };
        let tools_json = (tools_active && native).then(|| template_tools(conversation.tools));
        let text = self.template.render(&messages, tools_json.as_ref(), true)?;

        let grammar = if tools_active {
            let offered: Vec<&ToolDef> = match conversation.tool_choice {
                ToolChoice::Named(name) => conversation.tools.iter().filter(|t| &t.name == name).collect(),
                ToolChoice::None | ToolChoice::Auto | ToolChoice::Required => conversation.tools.iter().collect(),
            };
            let forced = matches!(conversation.tool_choice, ToolChoice::Required | ToolChoice::Named(_));
            tool_grammar(family, &offered, forced, one_call_or_more(conversation))
        } else {
            match conversation.response_format {
                ResponseFormat::Text => None,
                ResponseFormat::JsonObject => Some(value_grammar(json!({"type": "object"}))),
                ResponseFormat::JsonSchema(schema) => Some(value_grammar(schema.clone())),
            }
        };
        if let Some(spec) = &grammar {
            // Each schema was checked where the request came in; together
            // (many tools in one grammar) they may still pass a bound.
            crate::schema_limits::check(&spec.schema).map_err(FormatError::SchemaTooLarge)?;
        }
        Ok(PreparedPrompt {
            text,
            grammar,
            stops: self.template.extra_stops().to_vec(),
            tool_family: tools_active.then_some(family),
            chat: None,
        })
    }
}

/// Whether the reply may hold more than one call: a request that names a
/// function asks for that one call, whatever `parallel_tool_calls` says
/// (left to a small model, the same call comes back until the list's cap).
fn one_call_or_more(conversation: &Conversation<'_>) -> bool {
    conversation.parallel_tool_calls && !matches!(conversation.tool_choice, ToolChoice::Named(_))
}

fn value_grammar(schema: Value) -> GrammarSpec {
    GrammarSpec {
        schema,
        open: String::new(),
        separator: String::new(),
        close: String::new(),
        repeat: false,
        trigger: None,
    }
}

/// The grammar for tool calls in a family's syntax: forced from the first
/// token, or lazy from the family's call marker.
fn tool_grammar(family: ToolFamily, tools: &[&ToolDef], forced: bool, parallel: bool) -> Option<GrammarSpec> {
    let key = family.arguments_key();
    let shapes: Vec<Value> = tools
        .iter()
        .map(|tool| {
            let parameters = match &tool.parameters {
                Value::Object(map) if !map.is_empty() => tool.parameters.clone(),
                _ => json!({"type": "object"}),
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": tool.name}, key: parameters},
                "required": ["name", key],
            })
        })
        .collect();
    let schema = match <[Value; 1]>::try_from(shapes) {
        Ok([one]) => one,
        Err(many) => json!({"oneOf": many}),
    };
    let (open, separator, close) = match family {
        ToolFamily::Hermes | ToolFamily::Generic => {
            ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>")
        }
        ToolFamily::Mistral => ("[TOOL_CALLS][", ", ", "]"),
        ToolFamily::Llama3 => ("", "; ", ""),
    };
    let trigger = if forced {
        None
    } else {
        // Without a marker there is nothing to wait for; the model is trusted.
        Some(family.call_marker()?.to_string())
    };
    Some(GrammarSpec {
        schema,
        open: open.into(),
        separator: separator.into(),
        close: close.into(),
        repeat: parallel,
        trigger,
    })
}

/// Messages in the shape Hugging Face templates expect, with call arguments
/// as objects.
fn template_messages(messages: &[ChatMessage]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| {
                if let Some(raw) = &m.raw {
                    return json!({"role": m.role.template_name(), "content": raw});
                }
                let mut object = json!({"role": m.role.template_name(), "content": m.content});
                if !m.tool_calls.is_empty() {
                    object["tool_calls"] = m
                        .tool_calls
                        .iter()
                        .map(|call| {
                            let arguments = serde_json::from_str::<Value>(&call.arguments)
                                .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                            json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
                        })
                        .collect();
                }
                if let Some(id) = &m.tool_call_id {
                    object["tool_call_id"] = json!(id);
                }
                if let Some(name) = &m.name {
                    object["name"] = json!(name);
                }
                object
            })
            .collect(),
    )
}

fn template_tools(tools: &[ToolDef]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
            .collect(),
    )
}

/// Messages for a template that knows nothing of tools: the tools are described
/// in the system message, earlier calls are written out in the tags the model
/// is asked to use, and results come back as user turns, which every template
/// accepts.
fn generic_messages(messages: &[ChatMessage], tools: &[ToolDef]) -> Value {
    let mut converted: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        match m.role {
            Role::Assistant if m.raw.is_some() => converted.push(m.clone()),
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut content = m.content.clone();
                for call in &m.tool_calls {
                    let arguments = serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| json!({}));
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&format!(
                        "<tool_call>\n{}\n</tool_call>",
                        json!({"name": call.name, "arguments": arguments})
                    ));
                }
                converted.push(ChatMessage::new(Role::Assistant, content));
            }
            Role::Tool => {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match converted.last_mut() {
                    // Consecutive results of parallel calls share one turn.
                    Some(last) if last.role == Role::User && last.content.ends_with("</tool_response>") => {
                        last.content.push('\n');
                        last.content.push_str(&block);
                    }
                    _ => converted.push(ChatMessage::new(Role::User, block)),
                }
            }
            Role::System | Role::Developer | Role::User | Role::Assistant => {
                converted.push(ChatMessage { tool_calls: Vec::new(), ..m.clone() })
            }
        }
    }
    if !tools.is_empty() {
        let description = describe_tools(tools);
        match converted.first_mut() {
            Some(first) if matches!(first.role, Role::System | Role::Developer) => {
                first.content = format!("{}\n\n{}", first.content, description);
            }
            _ => converted.insert(0, ChatMessage::new(Role::System, description)),
        }
    }
    template_messages(&converted)
}

/// The tool section of the generic system message.
fn describe_tools(tools: &[ToolDef]) -> String {
    let mut text = String::from(
        "You can call tools. To call one, answer with only this, nothing before or after:\n\
         <tool_call>\n{\"name\": \"<tool name>\", \"arguments\": {<arguments as JSON>}}\n</tool_call>\n\
         The result comes back in <tool_response> tags. Tools:",
    );
    for tool in tools {
        text.push_str(&format!(
            "\n- {}: {} Arguments (JSON Schema): {}",
            tool.name,
            tool.description.trim(),
            tool.parameters
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;
    use pretty_assertions::assert_eq;

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    const HERMES: &str = "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endfor %}";

    fn format(template: &str) -> ChatFormat {
        match ChatTemplate::for_model(Some(template), "llama", "", "") {
            Ok(t) => ChatFormat::new(t),
            Err(err) => panic!("{err}"),
        }
    }

    fn weather() -> ToolDef {
        ToolDef {
            name: "get_weather".into(),
            description: "Weather for a city.".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }
    }

    fn prepare(format: &ChatFormat, messages: &[ChatMessage], tools: &[ToolDef], choice: ToolChoice) -> PreparedPrompt {
        let conversation = Conversation {
            messages,
            tools,
            tool_choice: &choice,
            parallel_tool_calls: false,
            response_format: &ResponseFormat::Text,
        };
        match format.prepare(&conversation) {
            Ok(p) => p,
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn capabilities_by_template() {
        let generic = format(CHATML);
        assert_eq!(generic.capabilities().tool_family, ToolFamily::Generic);
        assert!(!generic.capabilities().template_declares_tools);
        let hermes = format(HERMES);
        assert_eq!(hermes.capabilities().tool_family, ToolFamily::Hermes);
        assert!(hermes.capabilities().template_declares_tools);
    }

    #[test]
    fn generic_mode_describes_tools_and_rewrites_history() {
        let mut call_message = ChatMessage::new(Role::Assistant, "");
        call_message.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Paris\"}".into(),
        }];
        let mut result = ChatMessage::new(Role::Tool, "18 C");
        result.tool_call_id = Some("call_1".into());
        let messages = [ChatMessage::new(Role::User, "Weather in Paris?"), call_message, result];
        let prompt = prepare(&format(CHATML), &messages, &[weather()], ToolChoice::Auto);
        let expected = format!(
            "<|im_start|>system\n{}<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n\
             <|im_start|>assistant\n<tool_call>\n{{\"name\":\"get_weather\",\"arguments\":{{\"city\":\"Paris\"}}}}\n</tool_call><|im_end|>\n\
             <|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
            describe_tools(&[weather()])
        );
        assert_eq!(prompt.text, expected);
        assert_eq!(prompt.tool_family, Some(ToolFamily::Generic));
        let grammar = prompt.grammar.map(|g| (g.trigger, g.open, g.repeat));
        assert_eq!(grammar, Some((Some("<tool_call>".into()), "<tool_call>\n".into(), false)));
    }

    #[test]
    fn forced_choices_have_no_trigger_and_named_offers_one_tool() {
        let other = ToolDef { name: "other".into(), description: String::new(), parameters: json!({}) };
        let messages = [ChatMessage::new(Role::User, "x")];
        let format = format(CHATML);
        let required = prepare(&format, &messages, &[weather(), other.clone()], ToolChoice::Required);
        let grammar =
            required.grammar.as_ref().map(|g| (g.trigger.clone(), g.schema["oneOf"].as_array().map(Vec::len)));
        assert_eq!(grammar, Some((None, Some(2))));
        let named = prepare(&format, &messages, &[weather(), other], ToolChoice::Named("other".into()));
        assert_eq!(
            named.grammar.map(|g| g.schema),
            Some(
                json!({"type": "object", "properties": {"name": {"const": "other"}, "arguments": {"type": "object"}}, "required": ["name", "arguments"]})
            )
        );
    }

    #[test]
    fn a_named_function_is_one_call_whatever_parallel_tool_calls_says() {
        let messages = [ChatMessage::new(Role::User, "x")];
        let tools = [weather()];
        let format = format(CHATML);
        let repeats = |choice: ToolChoice, parallel_tool_calls: bool| {
            let conversation = Conversation {
                messages: &messages,
                tools: &tools,
                tool_choice: &choice,
                parallel_tool_calls,
                response_format: &ResponseFormat::Text,
            };
            let prepared = format.prepare(&conversation).expect("the conversation renders");
            prepared.grammar.map(|g| g.repeat)
        };
        assert_eq!(repeats(ToolChoice::Named("get_weather".into()), true), Some(false));
        assert_eq!(repeats(ToolChoice::Required, true), Some(true));
        assert_eq!(repeats(ToolChoice::Auto, true), Some(true));
        assert_eq!(repeats(ToolChoice::Required, false), Some(false));
    }

    #[test]
    fn tool_choice_errors() {
        let format = format(CHATML);
        let messages = [ChatMessage::new(Role::User, "x")];
        let cases = [
            (
                ToolChoice::Named("nope".into()),
                vec![weather()],
                "tool_choice names the tool 'nope', which is not in 'tools'",
            ),
            (ToolChoice::Required, vec![], "tool_choice 'required' needs at least one tool in 'tools'"),
        ];
        for (choice, tools, message) in cases {
            let conversation = Conversation {
                messages: &messages,
                tools: &tools,
                tool_choice: &choice,
                parallel_tool_calls: true,
                response_format: &ResponseFormat::Text,
            };
            assert_eq!(format.prepare(&conversation).map_err(|e| e.to_string()).err().as_deref(), Some(message));
        }
    }

    #[test]
    fn native_templates_receive_tools() {
        let messages = [ChatMessage::new(Role::User, "hi")];
        let prompt = prepare(&format(HERMES), &messages, &[weather()], ToolChoice::Auto);
        assert!(
            prompt.text.starts_with("<tools>[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
            "{}",
            prompt.text
        );
        assert_eq!(prompt.tool_family, Some(ToolFamily::Hermes));
    }
}

#[cfg(test)]
mod family_tests {
    use super::*;
    use serde_json::json;

    /// One template per syntax we know, plus the fallbacks.
    fn templates() -> Vec<(&'static str, Option<&'static str>, &'static str)> {
        vec![
            ("hermes", Some("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}<tool_call>{% endfor %}"), "qwen2"),
            ("mistral", Some("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}{{ m.content }}[TOOL_CALLS]{% endfor %}"), "llama"),
            ("llama3", Some("{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}<|python_tag|>{{ m.content }}{% endfor %}"), "llama"),
            ("chatml", Some("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"), "llama"),
            ("gemma without template", None, "gemma3"),
            ("base model without template", None, "mamba"),
        ]
    }

    /// A call to `name` written the way `family` writes calls.
    fn sample_call(family: ToolFamily, name: &str) -> String {
        match family {
            ToolFamily::Hermes | ToolFamily::Generic => {
                format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {{}}}}\n</tool_call>")
            }
            ToolFamily::Mistral => format!("[TOOL_CALLS][{{\"name\": \"{name}\", \"arguments\": {{}}}}]"),
            ToolFamily::Llama3 => format!("{{\"name\": \"{name}\", \"parameters\": {{}}}}"),
        }
    }

    /// Offering a tool is two halves decided in two places: the prompt must
    /// declare it and a parser must read the model's call. A family where
    /// one half works without the other would show raw markup to users, so
    /// every family either has both or is offered no tools at all.
    #[test]
    fn declaring_and_parsing_tools_always_agree() {
        let probe =
            ToolDef { name: "probe_tool".into(), description: "Probe.".into(), parameters: json!({"type": "object"}) };
        let messages = [ChatMessage::new(Role::User, "hi")];
        for (name, template, architecture) in templates() {
            let format = ChatFormat::new(ChatTemplate::for_model(template, architecture, "", "").unwrap());
            let caps = format.capabilities().clone();
            let conversation = Conversation {
                messages: &messages,
                tools: std::slice::from_ref(&probe),
                tool_choice: &ToolChoice::Auto,
                parallel_tool_calls: true,
                response_format: &ResponseFormat::Text,
            };
            let prepared = format.prepare(&conversation);
            if !caps.tools {
                assert!(
                    matches!(prepared, Err(FormatError::ToolsUnsupported)),
                    "{name}: tools offered without a way to use them"
                );
                continue;
            }
            let prepared = prepared.unwrap();
            assert!(prepared.text.contains("probe_tool"), "{name}: the tool is not declared in the prompt");
            let family = prepared.tool_family.unwrap();
            assert_eq!(family, caps.tool_family, "{name}");
            let parsed = family.parser().parse(&sample_call(family, "probe_tool"), &["probe_tool"]);
            assert_eq!(parsed.calls.len(), 1, "{name}: the {family:?} parser cannot read its own calls");
            assert_eq!(parsed.content, "", "{name}: call markup leaked into the content");
        }
    }
}
