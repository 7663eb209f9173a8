//! Shape checks seeds and restores apply to message-bearing events and request headers
//! (model §1.6 steps 3-4, §1.7). Content block internals are deliberately not validated.

use super::error::{MessageProblem, SessionError};
use super::event::{ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE};
use serde_json::{Map, Value};

/// The message an event carries: `data` itself for `user/message`, `data.message` otherwise.
pub fn carried_message<'data>(event_type: &str, data: &'data Value) -> Option<&'data Value> {
    if event_type == USER_MESSAGE {
        Some(data)
    } else {
        data.get("message")
    }
}

fn non_empty_string(value: Option<&Value>) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|text| !text.is_empty())
}

/// DSH `assertMessageEventShape` for the three surface types; other types pass.
pub fn check_message_shape(
    event_type: &str,
    data: &Value,
    subject: &str,
) -> Result<(), SessionError> {
    check_message_shape_with(event_type, data, || subject.to_owned())
}

/// [`check_message_shape`] with the error subject built only when there is an error.
pub fn check_message_shape_with(
    event_type: &str,
    data: &Value,
    subject: impl FnOnce() -> String,
) -> Result<(), SessionError> {
    if !super::event::is_surface_eligible_type(event_type) {
        return Ok(());
    }
    message_problem(event_type, data).map_or(Ok(()), |problem| {
        Err(SessionError::MessageShape {
            subject: subject(),
            problem,
        })
    })
}

fn message_problem(event_type: &str, data: &Value) -> Option<MessageProblem> {
    let Some(message) = carried_message(event_type, data).and_then(Value::as_object) else {
        return Some(MessageProblem::Unidentified);
    };
    if !non_empty_string(message.get("id")) {
        return Some(MessageProblem::Unidentified);
    }
    let role = if event_type == ASSISTANT_MESSAGE {
        "assistant"
    } else {
        "user"
    };
    if message.get("role").and_then(Value::as_str) != Some(role) {
        return Some(MessageProblem::WrongRole(role));
    }
    let Some(source) = message.get("source").and_then(Value::as_object) else {
        return Some(MessageProblem::InvalidSource);
    };
    if !non_empty_string(source.get("kind")) {
        return Some(MessageProblem::InvalidSource);
    }
    let Some(content) = message.get("content").and_then(Value::as_array) else {
        return Some(MessageProblem::InvalidContent);
    };
    match event_type {
        ASSISTANT_MESSAGE => assistant_problem(source),
        TOOL_RESULT => tool_result_problem(source, content),
        _ => None,
    }
}

fn assistant_problem(source: &Map<String, Value>) -> Option<MessageProblem> {
    let is_model = source.get("kind").and_then(Value::as_str) == Some("model")
        && non_empty_string(source.get("provider"))
        && non_empty_string(source.get("model"));
    (!is_model).then_some(MessageProblem::NotModelSource)
}

fn tool_result_problem(source: &Map<String, Value>, content: &[Value]) -> Option<MessageProblem> {
    let is_tool = source.get("kind").and_then(Value::as_str) == Some("tool")
        && non_empty_string(source.get("callId"));
    if !is_tool {
        return Some(MessageProblem::NotToolSource);
    }
    let block = match content {
        [block]
            if block.get("type").and_then(Value::as_str) == Some("tool-result")
                && block.get("content").is_some_and(Value::is_array) =>
        {
            block
        }
        _ => return Some(MessageProblem::NotOneToolResultBlock),
    };
    (block.get("toolCallId") != source.get("callId"))
        .then_some(MessageProblem::MismatchedToolCallIds)
}

/// Seed checks of a `request/header` payload (model §1.6 step 3).
pub fn check_request_header(data: &Value, index: usize) -> Result<(), SessionError> {
    let config = data.get("header").and_then(|header| header.get("config"));
    let has_route = config.is_some_and(|config| {
        non_empty_string(config.get("provider")) && non_empty_string(config.get("model"))
    });
    let Some(config) = config.filter(|_| has_route) else {
        return Err(SessionError::HeaderLacksProviderModel { index });
    };
    if config
        .get("reasoningEffort")
        .is_some_and(|effort| !non_empty_string(Some(effort)))
    {
        return Err(SessionError::HeaderInvalidReasoningEffort { index });
    }
    match data
        .get("header")
        .and_then(|header| header.get("adapterDefaults"))
    {
        Some(defaults) if !adapter_defaults_valid(defaults, config) => {
            Err(SessionError::HeaderInvalidAdapterDefaults { index })
        }
        _ => Ok(()),
    }
}

fn adapter_defaults_valid(defaults: &Value, config: &Value) -> bool {
    defaults.as_object().is_some_and(|markers| {
        markers.iter().all(|(key, marker)| {
            matches!(key.as_str(), "reasoningEffort" | "maxTokens")
                && *marker == Value::Bool(true)
                && config.get(key).is_some()
        })
    })
}

/// Whether a `request/header` uses the removed `reason: "fallback"`.
pub fn is_fallback_header(event_type: &str, data: &Value) -> bool {
    event_type == "request/header" && data.get("reason").and_then(Value::as_str) == Some("fallback")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shape_error(event_type: &str, data: Value) -> Option<String> {
        check_message_shape(event_type, &data, &format!("seed {event_type} at index 0"))
            .err()
            .map(|error| error.to_string())
    }

    #[test]
    fn message_shape_table_matches_dsh() {
        let user = |patch: Value| {
            let mut base = json!({"id":"u","role":"user","content":[],"source":{"kind":"user"}});
            if let (Some(base), Some(patch)) = (base.as_object_mut(), patch.as_object()) {
                base.extend(patch.clone());
            }
            base
        };
        let cases = [
            ("user/message", Value::Null, "lacks an identified message"),
            (
                "user/message",
                user(json!({"role":"assistant"})),
                "message must have role \"user\"",
            ),
            (
                "user/message",
                user(json!({"source":null})),
                "message has invalid source",
            ),
            (
                "user/message",
                user(json!({"content":"not-an-array"})),
                "message has invalid content",
            ),
            (
                "assistant/message",
                json!({"message":{"id":"a","role":"assistant","content":[],"source":{"kind":"user"}}}),
                "message must have model source",
            ),
            (
                "tool/result",
                json!({"message":user(json!({}))}),
                "message must have tool source",
            ),
            (
                "tool/result",
                json!({"message":user(json!({"source":{"kind":"tool","callId":"call"},"content":[{"type":"text","text":"not a result"}]}))}),
                "message must contain one tool-result block",
            ),
            (
                "tool/result",
                json!({"message":user(json!({"source":{"kind":"tool","callId":"other-call"},"content":[{"type":"tool-result","toolCallId":"call","content":[]}]}))}),
                "message has mismatched tool call ids",
            ),
            (
                "assistant/message",
                json!({"turn":1,"step":1,"content":[]}),
                "lacks an identified message",
            ),
        ];
        for (event_type, data, problem) in cases {
            let expected = format!("seed {event_type} at index 0 {problem}");
            assert_eq!(
                shape_error(event_type, data).as_deref(),
                Some(expected.as_str())
            );
        }
        assert_eq!(shape_error("user/message", user(json!({}))), None);
    }

    #[test]
    fn request_header_rules_match_dsh() {
        let header = |config: Value, defaults: Option<Value>| {
            let mut header = json!({"config": config});
            if let (Some(defaults), Some(map)) = (defaults, header.as_object_mut()) {
                map.insert("adapterDefaults".to_owned(), defaults);
            }
            json!({"header": header, "reason": "initial"})
        };
        let check = |data: Value| {
            check_request_header(&data, 0)
                .err()
                .map(|error| error.to_string())
        };
        let route = json!({"provider":"p","model":"m"});
        assert_eq!(
            check(header(json!({"model":"old-model"}), None)).as_deref(),
            Some("seed request/header at index 0 lacks provider/model")
        );
        assert_eq!(
            check(header(
                json!({"provider":"p","model":"m","reasoningEffort":""}),
                None
            ))
            .as_deref(),
            Some("seed request/header at index 0 has an invalid reasoningEffort")
        );
        for defaults in [
            Value::Null,
            json!([]),
            json!({"unknown":true}),
            json!({"maxTokens":false}),
            json!({"reasoningEffort":true}),
        ] {
            assert_eq!(
                check(header(route.clone(), Some(defaults))).as_deref(),
                Some("seed request/header at index 0 has invalid adapterDefaults")
            );
        }
        let with_tokens = json!({"provider":"p","model":"m","maxTokens":5});
        assert_eq!(
            check(header(with_tokens, Some(json!({"maxTokens":true})))),
            None
        );
    }
}
