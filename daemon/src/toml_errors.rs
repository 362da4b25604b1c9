//! TOML errors as a person reads them.

/// `error`, from parsing `text`, in words: a key missing at the top level is said to be one,
/// rather than pointed at line 1, column 1 with the file's first line under it; any other
/// error keeps its line and column.
pub fn describe_toml(error: &toml::de::Error, text: &str) -> String {
    match error.span() {
        Some(span) if span.start == 0 && (span.end == 0 || span.end >= text.trim_end().len()) => {
            format!(
                "{} (a top-level key: write it above the first [section])",
                error.message().trim_end()
            )
        }
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Config {
        federation: String,
        broker: Broker,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Broker {
        port: u16,
    }

    #[test]
    fn a_missing_top_level_key_is_named_without_line_1_column_1() {
        let text = "# a profile\n[broker]\nport = 1883\n";
        let error = toml::from_str::<Config>(text).unwrap_err();
        let said = describe_toml(&error, text);
        assert!(
            said.contains("federation") && said.contains("top-level"),
            "{said}"
        );
        assert!(!said.contains("line 1"), "{said}");
        // An error inside the file keeps its place.
        let text = "federation = \"x\"\n[broker]\nport = \"high\"\n";
        let error = toml::from_str::<Config>(text).unwrap_err();
        assert!(
            describe_toml(&error, text).contains("line 3"),
            "{}",
            describe_toml(&error, text)
        );
    }
}
