//! The file's YAML as arguments: each key names a flag ([`Schema`]), each value becomes
//! `--flag=value` for the flag's own parser.

use std::collections::HashMap;
use std::ffi::OsString;

use serde_yaml::Value;

use super::{CONFIG_FLAG, Entry, Schema, Setting, Takes};

/// The file's keys as arguments (`--long=value`), in the file's order.
pub(super) fn entries(schema: &Schema, text: &str) -> Result<Vec<Entry>, String> {
    let doc: Value = serde_yaml::from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
    let mut out = Vec::new();
    match doc {
        Value::Null => {}
        Value::Mapping(m) => walk(schema, &m, "", &mut out)?,
        other => {
            return Err(format!(
                "expected a mapping of settings (`key: value` lines), found {}",
                kind(&other)
            ));
        }
    }
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for e in &out {
        if let Some(first) = seen.insert(&e.setting.long, &e.key) {
            return Err(format!(
                "{first} and {} both set --{}: keep one",
                e.key, e.setting.long
            ));
        }
    }
    Ok(out)
}

fn walk(
    schema: &Schema,
    map: &serde_yaml::Mapping,
    prefix: &str,
    out: &mut Vec<Entry>,
) -> Result<(), String> {
    for (k, v) in map {
        let Value::String(k) = k else {
            return Err(format!(
                "{}a key is {}: keys are names",
                if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}: ")
                },
                kind(k)
            ));
        };
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(setting) = schema.keys.get(&key) {
            if let Some(args) = args_of(&key, setting, v)? {
                out.push(Entry {
                    key,
                    setting: setting.clone(),
                    args,
                });
            }
        } else if schema.is_section(&key) {
            match v {
                Value::Mapping(m) => walk(schema, m, &key, out)?,
                Value::Null => {}
                other => {
                    return Err(format!(
                        "{key}: expected a mapping of {key}.* settings, found {}",
                        kind(other)
                    ));
                }
            }
        } else {
            // An unknown section: name its first key in full (`wbe.listen_address`), which
            // is what is compared with the valid keys.
            let key = first_leaf(key, v);
            if key == CONFIG_FLAG {
                return Err(format!("{key}: a config file cannot name another one"));
            }
            return Err(match schema.nearest(&key) {
                Some(n) => format!("unknown key {key} (did you mean {n}?)"),
                None => format!(
                    "unknown key {key} (keys are the flags of `bufscope run --help`: \
                     --a.b-c is b_c under a)"
                ),
            });
        }
    }
    Ok(())
}

/// `key`, or its first key below when `v` is a mapping.
fn first_leaf(key: String, v: &Value) -> String {
    match v {
        Value::Mapping(m) => match m.iter().next() {
            Some((Value::String(k), v)) => first_leaf(format!("{key}.{k}"), v),
            _ => key,
        },
        _ => key,
    }
}

/// The arguments for `key: v`; None for an empty value.
fn args_of(key: &str, s: &Setting, v: &Value) -> Result<Option<Vec<OsString>>, String> {
    let arg = |x: &str| OsString::from(format!("--{}={x}", s.long));
    Ok(Some(match (s.takes, v) {
        (_, Value::Null) => return Ok(None),
        (Takes::Switch, Value::Bool(true)) => vec![OsString::from(format!("--{}", s.long))],
        (Takes::Switch, Value::Bool(false)) => Vec::new(),
        (Takes::Switch, other) => {
            return Err(format!(
                "{key}: expected true or false, found {}",
                kind(other)
            ));
        }
        (Takes::List, Value::Sequence(items)) => {
            if items.is_empty() && s.has_default {
                return Err(format!(
                    "{key}: an empty list: name at least one value, or leave the key out for \
                     the default"
                ));
            }
            items
                .iter()
                .map(|i| scalar(i).map(|x| arg(&x)))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("{key}: a list of plain values is expected"))?
        }
        (Takes::One, Value::Sequence(_)) => {
            return Err(format!("{key}: takes one value, found a list"));
        }
        (_, other) => {
            let x = scalar(other)
                .ok_or_else(|| format!("{key}: expected a value, found {}", kind(other)))?;
            vec![arg(&x)]
        }
    }))
}

/// A string, number or boolean as the command line would spell it.
fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "empty",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}
