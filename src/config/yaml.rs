//! The untyped pass over the YAML text (retired keys) and the mapping of
//! YAML parser errors to [`ConfigError`] with file, line and column.

use std::cell::Cell;
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

use super::RETIRED_KEYS;
use super::error::{ConfigError, Place};

// ---------------------------------------------------------------------------
// Retired keys: a pass over the whole YAML document, before the typed parse,
// so the retired-key message wins over serde's "unknown field".

pub(super) fn find_retired_keys(text: &str, file: &Path) -> Result<(), ConfigError> {
    let hit = Cell::new(None);
    let de = serde_norway::Deserializer::from_str(text);
    match (Scan {
        is_key: false,
        hit: &hit,
    })
    .deserialize(de)
    {
        Ok(()) => Ok(()),
        Err(e) => match hit.get() {
            Some(key) => Err(ConfigError::Retired {
                at: place(&e, file),
                key: key.to_owned(),
            }),
            None => Err(ConfigError::Syntax {
                at: place(&e, file),
                message: format!(
                    "{}{}",
                    message_without_location(&e),
                    syntax_hint(text, e.location().map(|l| (l.line(), l.column())))
                ),
            }),
        },
    }
}

/// Walks any YAML value; fails on a mapping key that is a retired key.
#[derive(Clone, Copy)]
struct Scan<'a> {
    is_key: bool,
    hit: &'a Cell<Option<&'static str>>,
}

impl<'de> DeserializeSeed<'de> for Scan<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        Ok(())
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if self.is_key
            && let Some(key) = RETIRED_KEYS.iter().find(|k| **k == v)
        {
            self.hit.set(Some(key));
            return Err(E::custom(format!("{key:?} was retired")));
        }
        Ok(())
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.value().deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.value().deserialize(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.value())?.is_some() {}
        Ok(())
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let key = Scan {
            is_key: true,
            hit: self.hit,
        };
        while map.next_key_seed(key)?.is_some() {
            map.next_value_seed(self.value())?;
        }
        Ok(())
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged value (`!tag value`): look inside it.
        use de::VariantAccess as _;
        let ((), variant) = data.variant_seed(self.value())?;
        variant.newtype_variant_seed(self.value())
    }
}

impl Scan<'_> {
    fn value(self) -> Self {
        Scan {
            is_key: false,
            ..self
        }
    }
}

/// A hint for the two syntax errors whose parser message does not say what
/// is wrong: a tab where YAML expects indentation, and a `{placeholder}`
/// value left unquoted (read as a YAML mapping). "" when neither applies.
fn syntax_hint(text: &str, at: Option<(usize, usize)>) -> String {
    let Some((line, column)) = at else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let Some(here) = line.checked_sub(1).and_then(|i| lines.get(i)) else {
        return String::new();
    };
    if here.chars().nth(column.saturating_sub(1)) == Some('\t') {
        return format!(
            "; line {line} has a tab at column {column}: YAML indents with spaces only, so replace the tab with spaces"
        );
    }
    // The unquoted value is on the error line or shortly before it.
    for n in (line.saturating_sub(3).max(1)..=line).rev() {
        let Some(text) = lines.get(n - 1) else {
            continue;
        };
        let item = text.trim_start().trim_start_matches("- ");
        if let Some((key, value)) = item.split_once(':')
            && !key.is_empty()
            && !key.contains(['"', '\'', '{'])
            && value.trim_start().starts_with('{')
        {
            return format!(
                "; line {n}: a value that starts with {{ is read as a YAML mapping, so put it in quotes: {}: \"{}\"",
                key.trim(),
                value.trim().replace('"', "\\\"")
            );
        }
    }
    String::new()
}

fn place(e: &serde_norway::Error, file: &Path) -> Place {
    Place {
        file: file.to_path_buf(),
        line_column: e.location().map(|l| (l.line(), l.column())),
    }
}

/// serde_norway appends " at line L column C"; the place is shown separately.
fn message_without_location(e: &serde_norway::Error) -> String {
    let text = e.to_string();
    match e.location() {
        Some(l) => text.replacen(
            &format!(" at line {} column {}", l.line(), l.column()),
            "",
            1,
        ),
        None => text,
    }
}

pub(super) fn yaml_error(e: &serde_norway::Error, file: &Path) -> ConfigError {
    let at = place(e, file);
    // serde speaks of fields; operators write keys.
    let mut message = message_without_location(e)
        .replacen("unknown field `", "unknown key `", 1)
        .replacen("missing field `", "missing required key `", 1)
        .replacen("duplicate field `", "duplicate key `", 1);
    if message.contains("missing required key `") {
        message.push_str("; add it");
    } else if message.contains("duplicate key `") {
        message.push_str("; keep only one of them");
    }
    if let Some(start) = message.find("unknown key `") {
        let rest = &message[start + "unknown key `".len()..];
        let key = rest.split('`').next().unwrap_or_default().to_owned();
        return ConfigError::UnknownKey { at, key, message };
    }
    ConfigError::Invalid { at, message }
}
