//! The configuration reference: a daemon's configuration type turned into Markdown through its
//! JSON Schema (schemars derives it from the types, their serde attributes and their doc
//! comments), so the page says what the code reads. `fedge-coordinator config-reference` and
//! `fedge-edge config-reference` print their part; docs/configuration.md is [`document`].
//!
//! One section per TOML table, top-level keys first, then the tables depth first in key order;
//! one row per key with its type, its default (as TOML) and its description. A flattened struct
//! shows as keys of the table it is flattened into (schemars merges it); an internally tagged
//! enum (a table with `kind = "…"`) lists each variant's keys under the tag's value.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde_json::{Map, Value};

/// Which daemon's configuration a reference describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    /// `fedge-coordinator`'s configuration file.
    Coordinator,
    /// `fedge-edge`'s device profile.
    Edge,
}

impl Daemon {
    fn title(self) -> &'static str {
        match self {
            Daemon::Coordinator => "fedge-coordinator: the coordinator's configuration",
            Daemon::Edge => "fedge-edge: the device profile",
        }
    }

    fn intro(self) -> &'static str {
        match self {
            Daemon::Coordinator => {
                "Read by `fedge-coordinator run --config FILE.toml` (and `check`, `ctl` and \
                 `publish-backbone`); `configs/coordinator.toml` is a federation's coordinator, \
                 `configs/site.toml` a site aggregator. Relative paths are resolved against the \
                 file's folder."
            }
            Daemon::Edge => {
                "Read by `fedge-edge run --config PROFILE.toml` (and `check`, `predict`, \
                 `enroll`, `site-stats` and `unit`); `firmware-configs/` holds one profile per \
                 hardware class. Relative paths are resolved against the profile's folder. \
                 Round settings (`[train]`) are not here: they come from the coordinator with \
                 every round task."
            }
        }
    }

    fn command(self) -> &'static str {
        match self {
            Daemon::Coordinator => "fedge-coordinator config-reference",
            Daemon::Edge => "fedge-edge config-reference",
        }
    }
}

/// The reference of `daemon`'s configuration type `T`, as Markdown: a `##` heading, then one
/// `###` section per table.
pub fn reference<T: JsonSchema>(daemon: Daemon) -> String {
    let schema = schemars::schema_for!(T);
    let root = schema.as_value();
    let empty = Map::new();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = format!("## {}\n\n{}\n", daemon.title(), daemon.intro());
    let _ = writeln!(
        out,
        "\nA key not listed here is refused at load, and so is a value outside its type or range. \
         `{}` prints this part.",
        daemon.command()
    );
    let renderer = Renderer { defs };
    renderer.table(&mut out, &[], root, None);
    out
}

/// docs/configuration.md: an introduction, then the coordinator's reference (`C`, its
/// configuration type) and the device profile's (`E`).
pub fn document<C: JsonSchema, E: JsonSchema>() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of the two configuration files fedge reads, as the code reads them: this page \
         is generated from the configuration types and their doc comments (their JSON Schema), \
         and a test fails when it differs from what the code generates. Do not edit it by hand; \
         after changing a configuration type, write it again with\n\n\
         ```sh\n\
         FEDGE_BLESS=1 cargo test --workspace --test it -- config_reference\n\
         ```\n\n\
         Each table below is a TOML table (`[broker]`, `[broker.tls]`, …; the first one holds \
         the keys before any table). A key without a default must be given; \"unset\" means the \
         key may be left out and the feature it names is then off or taken from elsewhere, as \
         its description says. Sizes in MiB are 2²⁰ bytes.\n\n",
    );
    out.push_str(&reference::<C>(Daemon::Coordinator));
    out.push('\n');
    out.push_str(&reference::<E>(Daemon::Edge));
    out
}

/// Walks one schema, resolving `$ref`s against its `$defs`.
struct Renderer<'a> {
    defs: &'a Map<String, Value>,
}

/// A property's schema with `$ref` followed and `Option`'s null taken off.
struct Resolved<'a> {
    /// The schema of the value itself.
    schema: &'a Value,
    /// Whether `null` is allowed: the field is an `Option`.
    nullable: bool,
}

impl<'a> Renderer<'a> {
    /// `schema`, with every `$ref` followed.
    fn follow(&self, mut schema: &'a Value) -> &'a Value {
        for _ in 0..32 {
            let Some(target) = schema.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let name = target.rsplit('/').next().unwrap_or(target);
            match self.defs.get(name) {
                Some(next) => schema = next,
                None => break,
            }
        }
        schema
    }

    /// A property's schema without the `null` of an `Option`.
    fn resolve(&self, schema: &'a Value) -> Resolved<'a> {
        let schema = self.follow(schema);
        let null = |s: &Value| s.get("type").and_then(Value::as_str) == Some("null");
        if let Some(any) = schema.get("anyOf").and_then(Value::as_array)
            && any.len() == 2
            && let Some(other) = any.iter().find(|s| !null(s))
            && any.iter().any(null)
        {
            return Resolved {
                schema: self.follow(other),
                nullable: true,
            };
        }
        let nullable = (schema.get("type").and_then(Value::as_array))
            .is_some_and(|types| types.iter().any(|t| t == "null"));
        Resolved { schema, nullable }
    }

    /// The variants of an internally tagged enum: its `oneOf` when every entry is a table.
    fn variants(&self, schema: &'a Value) -> Option<Vec<&'a Value>> {
        let one_of = schema.get("oneOf")?.as_array()?;
        let tables: Vec<&Value> = one_of.iter().map(|v| self.follow(v)).collect();
        tables
            .iter()
            .all(|v| v.get("properties").is_some())
            .then_some(tables)
    }

    /// Whether a property is a TOML table of its own (a struct, or a tagged enum of structs).
    fn is_table(&self, schema: &'a Value) -> bool {
        let schema = self.resolve(schema).schema;
        schema.get("properties").is_some() || self.variants(schema).is_some()
    }

    /// One table's section and the sections of the tables inside it. `path` is the table's
    /// TOML path (empty: the top level); `field` the property that holds it, and whether the
    /// parent requires it.
    fn table(&self, out: &mut String, path: &[&str], schema: &'a Value, field: Option<Field<'a>>) {
        let heading = match path {
            [] => "Top-level keys".to_owned(),
            _ => format!("`[{}]`", path.join(".")),
        };
        paragraph(out);
        let _ = writeln!(out, "### {heading}\n");
        let resolved = self.resolve(schema);
        // What the holding field says of the table; the type's own doc comment, written for
        // the code's readers, only when the field says nothing.
        let mut said: Vec<String> = (field.as_ref())
            .map(|f| f.description.or(description(resolved.schema)))
            .into_iter()
            .flatten()
            .map(clean)
            .collect();
        match &field {
            Some(f) if f.required => said.push("Required.".into()),
            Some(_) if resolved.nullable => said.push("Optional.".into()),
            _ => {}
        }
        if !said.is_empty() {
            let _ = writeln!(out, "{}\n", said.join(" "));
        }
        if let Some(variants) = self.variants(resolved.schema) {
            return self.tagged(out, path, &variants);
        }
        self.keys(out, path, resolved.schema, None);
    }

    /// The rows of a table's keys (without the tag `skip`), then its inner tables.
    fn keys(&self, out: &mut String, path: &[&str], schema: &'a Value, skip: Option<&str>) {
        let empty = Map::new();
        let properties = (schema.get("properties").and_then(Value::as_object)).unwrap_or(&empty);
        let required = |key: &str| {
            (schema.get("required").and_then(Value::as_array))
                .is_some_and(|r| r.iter().any(|k| k == key))
        };
        let rows: Vec<(&String, &Value)> = properties
            .iter()
            .filter(|(key, value)| Some(key.as_str()) != skip && !self.is_table(value))
            .collect();
        if !rows.is_empty() {
            out.push_str("| key | type | default | description |\n|---|---|---|---|\n");
        }
        for (key, value) in rows {
            let _ = writeln!(
                out,
                "| `{key}` | {} | {} | {} |",
                self.type_of(value),
                self.default_of(value, required(key)),
                self.describe(value),
            );
        }
        for (key, value) in properties.iter().filter(|(_, v)| self.is_table(v)) {
            let mut inner = path.to_vec();
            inner.push(key);
            let field = Field {
                description: description(value),
                required: required(key),
            };
            self.table(out, &inner, value, Some(field));
        }
    }

    /// An internally tagged enum's table: the tag's values, then each variant's keys.
    fn tagged(&self, out: &mut String, path: &[&str], variants: &[&'a Value]) {
        let tag_of = |v: &'a Value| -> Option<(&'a str, &'a str)> {
            let properties = v.get("properties")?.as_object()?;
            properties
                .iter()
                .find_map(|(k, p)| Some((k.as_str(), p.get("const")?.as_str()?)))
        };
        let name = path.join(".");
        let tags: Vec<(&str, &str)> = variants.iter().filter_map(|v| tag_of(v)).collect();
        if let Some((tag, _)) = tags.first() {
            let values: Vec<String> = tags.iter().map(|(_, v)| format!("`\"{v}\"`")).collect();
            let _ = writeln!(
                out,
                "Its keys depend on `{tag}`: {}.",
                alternatives(&values)
            );
        }
        for variant in variants {
            let Some((tag, value)) = tag_of(variant) else {
                self.keys(out, path, variant, None);
                continue;
            };
            paragraph(out);
            let _ = writeln!(out, "#### `[{name}]` with `{tag} = \"{value}\"`\n");
            if let Some(text) = description(variant) {
                let _ = writeln!(out, "{}\n", clean(text));
            }
            self.keys(out, path, variant, Some(tag));
        }
    }

    /// The type column: TOML's names for the JSON types, enums as their TOML spellings.
    fn type_of(&self, schema: &'a Value) -> String {
        let schema = self.resolve(schema).schema;
        if let Some(values) = self.choices(schema) {
            let values: Vec<String> = values.iter().map(|(v, _)| format!("`{v}`")).collect();
            return match values.len() {
                1 => values[0].clone(),
                _ => format!("one of {}", values.join(" \\| ")),
            };
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let names: Vec<String> = (types.into_iter().filter(|t| *t != "null"))
            .map(|t| match t {
                "array" => match schema.get("items") {
                    Some(items) => format!("array of {}", self.type_of(items)),
                    None => "array".into(),
                },
                "number" => "float".into(),
                "integer" if schema.get("minimum").and_then(Value::as_f64) == Some(0.0) => {
                    "integer ≥ 0".into()
                }
                "object" => "table".into(),
                other => other.into(),
            })
            .collect();
        match names.is_empty() {
            true => "any".into(),
            false => names.join(" or "),
        }
    }

    /// An enum's values as TOML strings, each with its description: `enum`, `const`, or a
    /// `oneOf` of constants (variants with doc comments).
    fn choices(&self, schema: &'a Value) -> Option<Vec<(String, Option<&'a str>)>> {
        let literal = |v: &Value| toml_value(v, None);
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            return Some(values.iter().map(|v| (literal(v), None)).collect());
        }
        if let Some(value) = schema.get("const") {
            return Some(vec![(literal(value), description(schema))]);
        }
        let one_of = schema.get("oneOf")?.as_array()?;
        let mut all = Vec::new();
        for variant in one_of {
            all.extend(self.choices(self.follow(variant))?);
        }
        Some(all)
    }

    /// The default column: the schema's default as TOML, else whether the key is required.
    fn default_of(&self, schema: &'a Value, required: bool) -> String {
        let resolved = self.resolve(schema);
        let format = resolved.schema.get("format").and_then(Value::as_str);
        match schema.get("default") {
            Some(Value::Null) => "unset".into(),
            Some(value) => format!("`{}`", toml_value(value, format).replace('|', "\\|")),
            None if required => "required".into(),
            None => "unset".into(),
        }
    }

    /// The description column: the field's doc comment, then what each enum value means.
    fn describe(&self, schema: &'a Value) -> String {
        let mut text = description(schema).map(clean).unwrap_or_default();
        let resolved = self.resolve(schema).schema;
        if text.is_empty() {
            text = description(resolved).map(clean).unwrap_or_default();
        }
        let choices = self.choices(resolved).unwrap_or_default();
        let meanings: Vec<String> = (choices.iter())
            .filter_map(|(value, meaning)| Some(format!("`{value}`: {}", clean(meaning.as_ref()?))))
            .collect();
        if !meanings.is_empty() {
            text = format!("{text} {}", meanings.join(" "));
        }
        text.trim().to_owned()
    }
}

/// `a`, `a or b`, `a, b or c`.
fn alternatives(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Ends `out` with a blank line, so that a heading starts a paragraph of its own.
fn paragraph(out: &mut String) {
    while !out.ends_with("\n\n") {
        out.push('\n');
    }
}

/// The property that holds a table.
struct Field<'a> {
    description: Option<&'a str>,
    required: bool,
}

fn description(schema: &Value) -> Option<&str> {
    schema
        .get("description")
        .and_then(Value::as_str)
        .filter(|d| !d.trim().is_empty())
}

/// A doc comment as one line of Markdown in a table cell: lines joined, rustdoc's intra-doc
/// link brackets taken off, and pipes escaped.
fn clean(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(joined.len());
    let mut rest = joined.as_str();
    while let Some(start) = rest.find("[`") {
        let after = &rest[start + 1..];
        match after.find("`]") {
            // `[`x`](url)` is a Markdown link and stays one.
            Some(end) if !after[end + 2..].starts_with('(') => {
                out.push_str(&rest[..start]);
                out.push_str(&after[..end + 1]);
                rest = &after[end + 2..];
            }
            _ => {
                out.push_str(&rest[..start + 2]);
                rest = &rest[start + 2..];
            }
        }
    }
    out.push_str(rest);
    out.replace('|', "\\|")
}

/// A JSON value as a TOML literal. `format` is the schema's: an `f32` ("float") is written
/// with its own shortest digits, not those of the `f64` it was widened to.
fn toml_value(value: &Value, format: Option<&str>) -> String {
    match value {
        Value::Null => "unset".into(),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => toml::Value::String(s.clone()).to_string(),
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let text = match format {
                Some("float") => (x as f32).to_string(),
                _ => x.to_string(),
            };
            match text.contains(['.', 'e', 'E', 'N', 'i']) {
                true => text,
                false => format!("{text}.0"),
            }
        }
        Value::Number(n) => n.to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|v| toml_value(v, format)).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let pairs: Vec<String> = (map.iter())
                .map(|(k, v)| format!("{k} = {}", toml_value(v, None)))
                .collect();
            format!("{{ {} }}", pairs.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_comments_become_one_cell() {
        assert_eq!(
            clean("Read by [`Config::load`]\ninto `a | b`; see [`x`](y)."),
            "Read by `Config::load` into `a \\| b`; see [`x`](y)."
        );
    }

    #[test]
    fn defaults_are_written_as_toml() {
        let v = |text: &str| serde_json::from_str::<Value>(text).unwrap();
        assert_eq!(toml_value(&v("0.10000000149011612"), Some("float")), "0.1");
        assert_eq!(toml_value(&v("60.0"), Some("double")), "60.0");
        assert_eq!(toml_value(&v("1e-5"), Some("double")), "0.00001");
        assert_eq!(toml_value(&v("3"), None), "3");
        assert_eq!(toml_value(&v("\"a\\\"b\""), None), "'a\"b'");
        assert_eq!(toml_value(&v("[\"x\", true]"), None), "[\"x\", true]");
    }
}
