//! The schema walk: every entry of every image, decoded against the descriptors of CRIU
//! 4.2.1's own `.proto` files ([`crate::proto::DESCRIPTORS`]), with each field present looked
//! up in the rule table ([`crate::rules`]).
//!
//! `prost` skips fields a type does not declare; this walk does not. A field number the
//! descriptor lacks (a newer CRIU's, or a forger's), an enum value it does not define, a
//! field the table has no rule for, or one whose rule refuses it, is a [`Violation`] naming
//! the image, the message and the field.

use std::sync::OnceLock;

use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage, Value,
};

use crate::rules::{self, Rule};

/// The descriptors of CRIU 4.2.1's image messages.
pub fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(crate::proto::DESCRIPTORS).expect("descriptors built by build.rs")
    })
}

/// The descriptor of message `name` (CRIU's protos have no package: `core_entry`).
pub fn message(name: &str) -> MessageDescriptor {
    pool()
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("CRIU 4.2.1 has no message {name}"))
}

/// One field the model does not accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The message (and the path to it from the entry's root: `core_entry.tc.rlimits`).
    pub at: String,
    /// The field's name, or its number when the descriptor has none.
    pub field: String,
    pub why: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{} {}", self.at, self.field, self.why)
    }
}

/// Decodes `bytes` as `desc` and walks it: the message, and what the model refuses in it.
pub fn walk(
    desc: &MessageDescriptor,
    bytes: &[u8],
) -> Result<(DynamicMessage, Vec<Violation>), prost::DecodeError> {
    let message = DynamicMessage::decode(desc.clone(), bytes)?;
    let mut out = Vec::new();
    visit(&message, &mut vec![desc.full_name().to_owned()], &mut out);
    Ok((message, out))
}

/// `path` is the way from the entry's root message to `message` (joined with `.` only when
/// a violation is reported: the walk visits every field of every entry).
fn visit(message: &DynamicMessage, path: &mut Vec<String>, out: &mut Vec<Violation>) {
    let desc = message.descriptor();
    for unknown in message.unknown_fields() {
        out.push(Violation {
            at: path.join("."),
            field: format!("#{}", unknown.number()),
            why: format!(
                "is field number {} that CRIU 4.2.1's {} does not have: not modeled, refused",
                unknown.number(),
                desc.full_name()
            ),
        });
    }
    for (field, value) in message.fields() {
        let refuse = |why: String| Violation {
            at: path.join("."),
            field: field.name().into(),
            why,
        };
        let Some(rule) = rules::rule(desc.full_name(), field.name()) else {
            out.push(refuse(
                "has no rule in gpusnap's model of CRIU's images: not modeled, refused".into(),
            ));
            continue;
        };
        match rule {
            Rule::Refused(why) => {
                out.push(refuse(format!("is present: refused ({why})")));
                continue;
            }
            Rule::RefusedUnlessDefault(why) if !is_default(value) => {
                out.push(refuse(format!("is {}: refused ({why})", shown(value))));
                continue;
            }
            _ => {}
        }
        if let Kind::Enum(e) = field.kind() {
            for v in values(value) {
                if let Value::EnumNumber(n) = v {
                    if e.get_value(*n).is_none() {
                        out.push(refuse(format!(
                            "is {n}, which CRIU 4.2.1's enum {} does not define: refused",
                            e.full_name()
                        )));
                    }
                }
            }
        }
        if matches!(field.kind(), Kind::Message(_)) {
            path.push(field.name().to_owned());
            for v in values(value) {
                if let Value::Message(m) = v {
                    visit(m, path, out);
                }
            }
            path.pop();
        }
    }
}

fn values(value: &Value) -> Vec<&Value> {
    match value {
        Value::List(list) => list.iter().collect(),
        other => vec![other],
    }
}

/// Whether a present field holds its type's zero value (false, 0, empty).
pub fn is_default(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::I32(v) => *v == 0,
        Value::I64(v) => *v == 0,
        Value::U32(v) => *v == 0,
        Value::U64(v) => *v == 0,
        Value::F32(v) => *v == 0.0,
        Value::F64(v) => *v == 0.0,
        Value::EnumNumber(v) => *v == 0,
        Value::Bytes(b) => b.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        Value::Message(_) => false,
    }
}

fn shown(value: &Value) -> String {
    match value {
        Value::Bytes(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Value::List(l) => format!("a list of {}", l.len()),
        Value::Message(_) => "a message".into(),
        other => format!("{other:?}"),
    }
}

/// Every (message, field) reachable from `root` through message-typed fields, except below
/// fields the table refuses: what the rule table must cover.
pub fn reachable(root: &MessageDescriptor) -> Vec<(String, FieldDescriptor)> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let mut todo = vec![root.clone()];
    while let Some(m) = todo.pop() {
        if !seen.insert(m.full_name().to_owned()) {
            continue;
        }
        for f in m.fields() {
            // Nothing below a refused field is ever walked.
            let refused = matches!(
                rules::rule(m.full_name(), f.name()),
                Some(Rule::Refused(_) | Rule::RefusedUnlessDefault(_))
            );
            if let Kind::Message(inner) = f.kind() {
                if !refused {
                    todo.push(inner);
                }
            }
            out.push((m.full_name().to_owned(), f));
        }
    }
    out
}
