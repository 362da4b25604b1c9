//! Plain-text lists a user writes by hand: one entry per line (the federation's class list).

use std::path::Path;

/// Reads one entry per line, trimmed; blank lines and lines starting with `#` are skipped.
pub fn read_list(path: &Path) -> std::io::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn comments_and_blank_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("classes.txt");
        std::fs::write(&path, "# parts\nok\n\n  scratch  \n# end\n").unwrap();
        assert_eq!(super::read_list(&path).unwrap(), ["ok", "scratch"]);
    }
}
