//! Unknown keys in the coordinator's TOML, found before its values are read, each named with
//! its line, the table it is in, that table's keys and the closest of them: serde's own
//! message has none of these for the top level (the strategy's keys are flattened into it, so
//! serde reads the whole file before it sees the key, and loses its place).
//!
//! The tables and their keys come from the configuration's JSON Schema (what
//! docs/configuration.md is made from), so this list cannot drift from what the code reads;
//! only tables that refuse unknown keys (`deny_unknown_fields`) are checked.

use std::fmt;

use schemars::JsonSchema;
use serde_json::{Map, Value};
use toml::Spanned;
use toml::de::{DeString, DeTable, DeValue};

/// A key no table of its place takes.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownKey {
    /// The line it is on, from 1.
    pub line: usize,
    /// The key as written.
    pub key: String,
    /// The TOML path of the table it is in (empty: the top level).
    pub table: Vec<String>,
    /// Whether it is a table itself (`[name]`) rather than a key.
    pub is_table: bool,
    /// The keys that table takes (plain keys first, then its tables), each in alphabetical order.
    pub valid: Vec<Valid>,
    /// What it most likely is.
    pub hint: Option<Hint>,
}

/// A key a table takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid {
    /// Its name.
    pub name: String,
    /// Whether it is a table (`[table.name]`).
    pub is_table: bool,
}

/// What an unknown key most likely is.
#[derive(Debug, Clone, PartialEq)]
pub enum Hint {
    /// The closest key of the same table, by edit distance.
    Closest(String),
    /// A key of other tables, spelled right but in the wrong place (e.g. a top-level key
    /// written below a `[section]`): the paths of the tables that take it, shortest first.
    Elsewhere(Vec<Vec<String>>),
}

/// The first unknown key of `text` (by its place in the file) against `T`'s schema, if any;
/// `None` as well for text that is not TOML, which serde then describes.
pub fn find<T: JsonSchema>(text: &str) -> Option<UnknownKey> {
    let document = DeTable::parse(text).ok()?;
    let schema = schemars::schema_for!(T);
    let root = schema.as_value();
    let empty = Map::new();
    let defs = (root.get("$defs").and_then(Value::as_object)).unwrap_or(&empty);
    let walker = Walker { defs, root };
    let mut found = Vec::new();
    walker.table(document.get_ref(), root, &mut Vec::new(), &mut found);
    let (start, mut unknown) = found.into_iter().min_by_key(|(start, _)| *start)?;
    unknown.line = text[..start.min(text.len())].matches('\n').count() + 1;
    unknown.hint = walker.hint(&unknown);
    Some(unknown)
}

/// The schema, with its definitions for `$ref`s.
struct Walker<'a> {
    defs: &'a Map<String, Value>,
    root: &'a Value,
}

impl<'a> Walker<'a> {
    /// `schema` with `$ref`s followed and the `null` of an `Option` taken off.
    fn resolve(&self, mut schema: &'a Value) -> &'a Value {
        for _ in 0..32 {
            if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
                let name = target.rsplit('/').next().unwrap_or(target);
                match self.defs.get(name) {
                    Some(next) => schema = next,
                    None => return schema,
                }
                continue;
            }
            let null = |s: &Value| s.get("type").and_then(Value::as_str) == Some("null");
            match schema.get("anyOf").and_then(Value::as_array) {
                Some(any) if any.len() == 2 && any.iter().any(null) => {
                    match any.iter().find(|s| !null(s)) {
                        Some(other) => schema = other,
                        None => return schema,
                    }
                }
                _ => return schema,
            }
        }
        schema
    }

    /// The keys a table's schema takes, with each key's schema, and whether it refuses
    /// others; `None` when the schema is not a table. A tagged enum of tables takes the keys
    /// of every variant.
    fn keys(&self, schema: &'a Value) -> Option<(Vec<(&'a String, &'a Value)>, bool)> {
        let schema = self.resolve(schema);
        let closed = |s: &Value| s.get("additionalProperties") == Some(&Value::Bool(false));
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            return Some((properties.iter().collect(), closed(schema)));
        }
        let variants = schema.get("oneOf")?.as_array()?;
        let mut keys: Vec<(&String, &Value)> = Vec::new();
        let mut all_closed = true;
        for variant in variants {
            let variant = self.resolve(variant);
            let properties = variant.get("properties")?.as_object()?;
            all_closed &= closed(variant);
            for (key, value) in properties {
                if !keys.iter().any(|(k, _)| *k == key) {
                    keys.push((key, value));
                }
            }
        }
        Some((keys, all_closed))
    }

    /// Collects the unknown keys of `table` (at `path`, of `schema`) and of the tables in it,
    /// each with where its key starts in the text.
    fn table(
        &self,
        table: &DeTable<'_>,
        schema: &'a Value,
        path: &mut Vec<String>,
        found: &mut Vec<(usize, UnknownKey)>,
    ) {
        let Some((keys, closed)) = self.keys(schema) else {
            return;
        };
        for (key, value) in table {
            let name: &str = key.get_ref();
            match keys.iter().find(|(k, _)| k.as_str() == name) {
                Some((_, inner)) => {
                    path.push(name.to_owned());
                    self.value(value, inner, path, found);
                    path.pop();
                }
                None if closed => {
                    let unknown = UnknownKey {
                        line: 0,
                        key: name.to_owned(),
                        table: path.clone(),
                        is_table: matches!(value.get_ref(), DeValue::Table(_)),
                        valid: self.valid(&keys),
                        hint: None,
                    };
                    found.push((span_start(key), unknown));
                }
                None => {}
            }
        }
    }

    /// Walks into a value that is a table, or an array of tables.
    fn value(
        &self,
        value: &Spanned<DeValue<'_>>,
        schema: &'a Value,
        path: &mut Vec<String>,
        found: &mut Vec<(usize, UnknownKey)>,
    ) {
        match value.get_ref() {
            DeValue::Table(inner) => self.table(inner, schema, path, found),
            DeValue::Array(items) => {
                let Some(item) = self.resolve(schema).get("items") else {
                    return;
                };
                for value in items.iter() {
                    self.value(value, item, path, found);
                }
            }
            _ => {}
        }
    }

    /// A table's keys as the message lists them: plain keys, then tables.
    fn valid(&self, keys: &[(&'a String, &'a Value)]) -> Vec<Valid> {
        let mut valid: Vec<Valid> = (keys.iter())
            .map(|(name, schema)| Valid {
                name: (*name).clone(),
                is_table: self.keys(schema).is_some(),
            })
            .collect();
        valid.sort_by_key(|v| v.is_table);
        valid
    }

    /// The key elsewhere in the schema when it is spelled right, else the closest key of its
    /// table when it is close enough to be a typo.
    fn hint(&self, unknown: &UnknownKey) -> Option<Hint> {
        let is_table = unknown.is_table;
        let mut elsewhere = Vec::new();
        self.places(self.root, &mut Vec::new(), &unknown.key, &mut elsewhere);
        if !elsewhere.is_empty() {
            elsewhere.sort_by_key(Vec::len);
            return Some(Hint::Elsewhere(elsewhere));
        }
        let candidates = (unknown.valid.iter()).filter(|v| v.is_table == is_table || !is_table);
        let (distance, closest) = candidates
            .map(|v| (distance(&unknown.key, &v.name), &v.name))
            .min()?;
        let allowed = (unknown.key.chars().count() / 3).max(1);
        (distance <= allowed).then(|| Hint::Closest(closest.clone()))
    }

    /// The paths of the tables (below `schema`, at `path`) that take `key`.
    fn places(
        &self,
        schema: &'a Value,
        path: &mut Vec<String>,
        key: &str,
        out: &mut Vec<Vec<String>>,
    ) {
        let Some((keys, _)) = self.keys(schema) else {
            return;
        };
        // A definition that holds itself is not walked around forever.
        if path.len() > 8 {
            return;
        }
        for (name, inner) in keys {
            if name == key {
                out.push(path.clone());
            }
            let inner = match self.resolve(inner).get("items") {
                Some(items) => items,
                None => inner,
            };
            path.push(name.clone());
            self.places(inner, path, key, out);
            path.pop();
        }
    }
}

/// Where a key starts in the text.
fn span_start(key: &Spanned<DeString<'_>>) -> usize {
    key.span().start
}

/// The optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// two neighbours, one each.
pub fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            d[i * width + j] = match (i, j) {
                (0, j) => j,
                (i, 0) => i,
                _ => {
                    let cost = usize::from(a[i - 1] != b[j - 1]);
                    let mut best = (d[(i - 1) * width + j] + 1)
                        .min(d[i * width + j - 1] + 1)
                        .min(d[(i - 1) * width + j - 1] + cost);
                    if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                        best = best.min(d[(i - 2) * width + j - 2] + 1);
                    }
                    best
                }
            };
        }
    }
    d[a.len() * width + b.len()]
}

/// `a`, `a or b`, `a, b or c`.
fn alternatives(items: &[String]) -> String {
    match items {
        [rest @ .., last] if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => items.join(""),
    }
}

/// `[a.b]`, or "the top level".
fn table_name(path: &[String]) -> String {
    match path {
        [] => "the top level".to_owned(),
        _ => format!("[{}]", path.join(".")),
    }
}

impl UnknownKey {
    /// `key` as the message names it: `` `key` ``, or `[table.key]` for a table.
    fn named(&self, key: &str, is_table: bool) -> String {
        match is_table {
            true => {
                let mut path = self.table.clone();
                path.push(key.to_owned());
                format!("[{}]", path.join("."))
            }
            false => format!("`{key}`"),
        }
    }
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = table_name(&self.table);
        let what = if self.is_table { "table" } else { "key" };
        let named = self.named(&self.key, self.is_table);
        write!(f, "line {}: unknown {what} {named}", self.line)?;
        if !self.table.is_empty() {
            write!(f, " in {table}")?;
        }
        match &self.hint {
            Some(Hint::Closest(closest)) => {
                write!(f, "; did you mean {}?", self.named(closest, self.is_table))?
            }
            Some(Hint::Elsewhere(paths)) if paths[0].is_empty() && !self.is_table => write!(
                f,
                "; {named} is a top-level key: write it above the first [section]."
            )?,
            Some(Hint::Elsewhere(paths)) if self.is_table => {
                let places: Vec<String> = (paths.iter())
                    .map(|p| {
                        let mut path = p.clone();
                        path.push(self.key.clone());
                        format!("[{}]", path.join("."))
                    })
                    .collect();
                write!(f, "; did you mean {}?", alternatives(&places))?
            }
            Some(Hint::Elsewhere(paths)) => {
                let places: Vec<String> = paths.iter().map(|p| table_name(p)).collect();
                write!(f, "; {named} belongs in {}.", alternatives(&places))?
            }
            None => write!(f, ".")?,
        }
        let list = |tables: bool| -> Vec<String> {
            (self.valid.iter())
                .filter(|v| v.is_table == tables)
                .map(|v| self.named(&v.name, tables))
                .collect()
        };
        let (keys, tables) = (list(false), list(true));
        let mut table = table;
        if let Some(first) = table.get(..1) {
            table = first.to_uppercase() + &table[1..];
        }
        write!(f, " {table} takes")?;
        if !keys.is_empty() {
            write!(f, " the keys {}", keys.join(", "))?;
        }
        if !tables.is_empty() {
            let and = if keys.is_empty() { "" } else { " and" };
            write!(f, "{and} the tables {}", tables.join(", "))?;
        }
        if keys.is_empty() && tables.is_empty() {
            write!(f, " no keys")?;
        }
        write!(f, ".")
    }
}

#[cfg(test)]
#[path = "unknown_tests.rs"]
mod tests;
