//! The module graph of a crate, read from its source text.
//!
//! Nodes are a crate's files; a file has an edge to every file whose items it names
//! (`use crate::…`, `super::…`, `self::…`, a child module's path). A `pub use` re-export is no
//! dependency of its own: a path through it is followed to the file that defines the item.
//! Intra-doc links count as paths, and a file of tests (`round/tests.rs`) counts like any file;
//! paths inside inline modules (`mod tests { … }`) that stay in the file are not edges, and a
//! binary's `main.rs` beside a `lib.rs` is a crate of its own. Cycles are looked for twice:
//! between files, and between the sibling modules of every folder (a module standing for all
//! the files below it).
//!
//! The parser is deliberately small: it reads paths as text, so it can be fooled by a path in
//! a string or a comment; it never misses a `use` line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest source file allowed, without its tests.
pub const MAX_LINES: usize = 600;

/// The workspace's library crates: (folder, source root).
pub const CRATES: [&str; 13] = [
    "wire",
    "card",
    "models",
    "mqtt",
    "daemon",
    "privacy",
    "device",
    "edge",
    "rounds",
    "coordinator",
    "sim",
    "redteam",
    "front",
];

/// One source file: its module path (`["round", "admit"]`) and text.
#[derive(Debug)]
pub struct SourceFile {
    /// Path on disk.
    pub path: PathBuf,
    /// Module path from the crate root (empty for `lib.rs`/`main.rs`).
    pub module: Vec<String>,
    /// The text without comments and without the `#[cfg(test)]` module (empty for a file that
    /// only holds tests, which is neither counted for length nor checked for I/O).
    pub code: String,
    /// What the module graph reads: the text without its inline `#[cfg(test)]` module (a file
    /// of tests, like `round/tests.rs`, is read whole), comments cut but the paths of
    /// intra-doc links kept (a link is a dependency for rustdoc and for a reader).
    pub graph_code: String,
    /// Lines of that text that are not blank.
    pub lines: usize,
    /// A binary's root beside a library (not part of the library's module graph).
    pub binary: bool,
}

/// Reads the files of the crate whose sources are under `src`.
pub fn read_crate(src: &Path) -> Vec<SourceFile> {
    let mut out = Vec::new();
    collect(src, src, &mut out);
    out
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<SourceFile>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            // A folder of its own binaries or tests is not part of the library's graph.
            if path.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            collect(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap();
            let mut module: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let test_file = is_test_file(&text);
            // A binary next to a library is a crate of its own: it only sees the library's
            // public paths, so it is counted for length but is no node of the library's graph.
            let binary = path.file_name().is_some_and(|n| n == "main.rs")
                && path.with_file_name("lib.rs").exists();
            let code = if test_file {
                String::new()
            } else {
                strip_tests(&strip_comments(&text))
            };
            let lines = code.lines().filter(|l| !l.trim().is_empty()).count();
            out.push(SourceFile {
                path,
                module,
                code,
                graph_code: keep_doc_links(&strip_tests(&text)),
                lines,
                binary,
            });
        }
    }
}

/// A file included only under `#[cfg(test)]` (its parent says so) starts with a test marker
/// in practice: `use super::*;` plus `#[test]` functions and nothing public.
fn is_test_file(text: &str) -> bool {
    text.contains("#[test]") && !text.contains("pub fn") && !text.contains("pub struct")
}

fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // Keep `//` inside strings such as URLs: only cut when no quote precedes it.
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Comments cut, each replaced by the paths its intra-doc links name (``[`crate::a::B`]``).
fn keep_doc_links(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) if !line[..i].contains('"') => {
                let links: Vec<&str> = line[i..]
                    .split("[`")
                    .skip(1)
                    .filter_map(|rest| rest.split_once("`]").map(|(link, _)| link))
                    .filter(|link| link.contains("::"))
                    .collect();
                format!("{} {}", &line[..i], links.join(" "))
            }
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Cuts the `#[cfg(test)] mod … { … }` blocks (and `#[cfg(test)] mod name;` lines).
fn strip_tests(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        // Skip the item that follows: up to its matching close brace, or its semicolon.
        let brace = after.find('{');
        let semi = after.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => s + 1,
            (Some(b), _) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, c) in after[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The module paths a file names, resolved to absolute module paths (without the item).
fn referenced_paths(
    file: &SourceFile,
    modules: &BTreeSet<Vec<String>>,
) -> Vec<(Vec<String>, bool)> {
    let mut out = Vec::new();
    let is_mod_rs = file
        .path
        .file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
    // The module that `super` and `self` refer to.
    let here: Vec<String> = file.module.clone();
    for (statement, nesting) in statements(&file.graph_code) {
        let reexport = statement.trim_start().starts_with("pub use")
            || statement.trim_start().starts_with("pub(crate) use");
        for path in paths_in(&statement) {
            let mut segments: Vec<String> = Vec::new();
            let mut parts = path.split("::").map(str::trim).filter(|s| !s.is_empty());
            let Some(first) = parts.next() else { continue };
            if nesting > 0 {
                // Inside an inline module: `self::` and one `super::` per level stay in this
                // file; a bare name is the inline module's own.
                let supers = path.split("::").take_while(|s| s.trim() == "super").count();
                match first {
                    "crate" => {}
                    "super" if supers > nesting => {
                        let mut base = here.clone();
                        for _ in 0..supers - nesting {
                            base.pop();
                        }
                        segments.extend(base);
                        let rest: Vec<&str> = path.split("::").skip(supers).collect();
                        push_path(&mut segments, &rest, modules);
                        out.push((std::mem::take(&mut segments), reexport));
                    }
                    _ => {}
                }
                if first != "crate" {
                    continue;
                }
            }
            match first {
                "crate" => {}
                "self" => segments.extend(here.iter().cloned()),
                "super" => {
                    let mut base = here.clone();
                    base.pop();
                    segments.extend(base);
                }
                child if is_mod_rs || !here.is_empty() => {
                    // A child module named without `self::` (only meaningful from the parent).
                    let mut candidate = here.clone();
                    candidate.push(child.to_owned());
                    if !modules.contains(&candidate) {
                        continue;
                    }
                    segments = here.clone();
                    segments.push(child.to_owned());
                }
                _ => continue,
            }
            let mut rest: Vec<&str> = parts.collect();
            while rest.first() == Some(&"super") {
                segments.pop();
                rest.remove(0);
            }
            push_path(&mut segments, &rest, modules);
            out.push((segments, reexport));
        }
    }
    out
}

/// Appends the module segments of `rest` that name modules, then the item as `#item`.
fn push_path(segments: &mut Vec<String>, rest: &[&str], modules: &BTreeSet<Vec<String>>) {
    for segment in rest {
        let name = segment
            .trim()
            .trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
            .to_owned();
        let mut next = segments.clone();
        next.push(name.clone());
        if modules.contains(&next) {
            *segments = next;
        } else {
            // The item: kept to follow re-exports.
            if !name.is_empty() {
                segments.push(format!("#{name}"));
            }
            break;
        }
    }
}

/// `use` statements (whole, across lines) and every other line, each with the number of inline
/// modules (`mod tests { … }`, `mod avx2 { … }`) it sits in.
fn statements(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut depth = 0usize;
    // Brace depths at which inline modules opened.
    let mut inline: Vec<usize> = Vec::new();
    for line in code.lines() {
        let t = line.trim_start();
        let nesting = inline.len();
        if !pending.is_empty() {
            pending.push_str(line);
            if line.contains(';') {
                out.push((std::mem::take(&mut pending), nesting));
            }
        } else if (t.starts_with("use ")
            || t.starts_with("pub use ")
            || t.starts_with("pub(crate) use "))
            && !t.contains(';')
        {
            pending.push_str(line);
        } else {
            out.push((line.to_owned(), nesting));
        }
        let opens_module = {
            let u = t
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            u.starts_with("mod ") && u.trim_end().ends_with('{')
        };
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.last() == Some(&depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
        if opens_module {
            inline.push(depth - 1);
        }
    }
    out
}

/// Paths in a statement: each `a::b::c` run, with `{x, y::z}` groups expanded.
fn paths_in(statement: &str) -> Vec<String> {
    let body = statement
        .trim_start()
        .trim_start_matches("pub(crate) ")
        .trim_start_matches("pub ")
        .trim_start();
    if let Some(tree) = body.strip_prefix("use ") {
        return expand(tree.trim_end().trim_end_matches(';'));
    }
    // Ordinary code: every token containing `::` that starts with crate/self/super or a name.
    let mut out = Vec::new();
    for token in statement.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
        if token.contains("::") {
            out.push(token.to_owned());
        }
    }
    out
}

fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    match tree.find('{') {
        None => vec![tree.split(" as ").next().unwrap_or("").trim().to_owned()],
        Some(open) => {
            let prefix = &tree[..open];
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut parts = Vec::new();
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            parts
                .into_iter()
                .filter(|p| !p.trim().is_empty())
                .flat_map(expand)
                .map(|p| {
                    if p == "self" {
                        prefix.trim_end_matches("::").to_owned()
                    } else {
                        format!("{prefix}{p}")
                    }
                })
                .collect()
        }
    }
}

/// Names a file defines at its top level (structs, enums, traits, functions, types, consts).
fn definitions(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let t = line
            .trim_start()
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ");
        for keyword in [
            "struct ",
            "enum ",
            "trait ",
            "fn ",
            "type ",
            "const ",
            "static ",
            "async fn ",
        ] {
            if let Some(rest) = t.strip_prefix(keyword) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// The dependency graph between the files of one crate: file index → file indices.
pub fn file_graph(files: &[&SourceFile]) -> BTreeMap<usize, BTreeSet<usize>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let by_module: BTreeMap<&Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (&f.module, i))
        .collect();
    let defs: Vec<BTreeSet<String>> = files.iter().map(|f| definitions(&f.code)).collect();
    // Re-exports: (module, item) → the module path it re-exports from.
    let mut reexports: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
    let mut refs = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let r = referenced_paths(file, &modules);
        for (path, reexport) in &r {
            if *reexport && let Some(item) = path.last().and_then(|s| s.strip_prefix('#')) {
                reexports.insert((i, item.to_owned()), path[..path.len() - 1].to_vec());
            }
        }
        refs.push(r);
    }
    let resolve = |path: &[String]| -> Option<usize> {
        let (module, item) = match path.last().and_then(|s| s.strip_prefix('#')) {
            Some(item) => (&path[..path.len() - 1], Some(item.to_owned())),
            None => (path, None),
        };
        let mut target = *by_module.get(&module.to_vec())?;
        // Follow re-exports to the file that defines the item.
        if let Some(item) = item {
            let mut hops = 0;
            while !defs[target].contains(&item) && hops < 8 {
                let Some(from) = reexports.get(&(target, item.clone())) else {
                    break;
                };
                let Some(&next) = by_module.get(from) else {
                    break;
                };
                target = next;
                hops += 1;
            }
        }
        Some(target)
    };
    let mut graph: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, r) in refs.iter().enumerate() {
        let edges = graph.entry(i).or_default();
        for (path, reexport) in r {
            if *reexport {
                continue;
            }
            if let Some(j) = resolve(path)
                && j != i
            {
                edges.insert(j);
            }
        }
    }
    graph
}

/// Every cycle's files (strongly connected components of more than one file).
pub fn cycles(files: &[SourceFile]) -> Vec<Vec<PathBuf>> {
    let files: Vec<&SourceFile> = files.iter().filter(|f| !f.binary).collect();
    let graph = file_graph(&files);
    components(files.len(), &graph)
        .into_iter()
        .map(|c| {
            let mut paths: Vec<PathBuf> = c.into_iter().map(|i| files[i].path.clone()).collect();
            paths.sort();
            paths
        })
        .collect()
}

/// Every cycle between sibling modules: for each folder (the crate root included), its child
/// modules, each standing for all the files below it, with an edge where a file of one names
/// a file of another. Returns `folder: a ↔ b ↔ …` lines.
pub fn module_cycles(files: &[SourceFile]) -> Vec<String> {
    let files: Vec<&SourceFile> = files.iter().filter(|f| !f.binary).collect();
    let graph = file_graph(&files);
    let folders: BTreeSet<&[String]> = files
        .iter()
        .filter(|f| !f.module.is_empty())
        .map(|f| &f.module[..f.module.len() - 1])
        .collect();
    let mut out = Vec::new();
    for folder in folders {
        let depth = folder.len();
        // The child module of `folder` that file `i` belongs to, if it is below `folder`.
        let child = |i: usize| -> Option<&String> {
            let m = &files[i].module;
            (m.len() > depth && m[..depth] == *folder).then(|| &m[depth])
        };
        let names: Vec<&String> = (0..files.len())
            .filter_map(child)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let index = |name: &String| names.iter().position(|n| *n == name);
        let mut modules: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for (from, targets) in &graph {
            let Some(a) = child(*from).and_then(index) else {
                continue;
            };
            for to in targets {
                if let Some(b) = child(*to).and_then(index)
                    && a != b
                {
                    modules.entry(a).or_default().insert(b);
                }
            }
        }
        for component in components(names.len(), &modules) {
            let mut cycle: Vec<&str> = component.iter().map(|&i| names[i].as_str()).collect();
            cycle.sort();
            out.push(format!("{}: {}", folder.join("/"), cycle.join(" ↔ ")));
        }
    }
    out
}

/// Strongly connected components of more than one node (Tarjan's algorithm).
fn components(nodes: usize, graph: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct State<'a> {
        graph: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: BTreeMap<usize, usize>,
        low: BTreeMap<usize, usize>,
        stack: Vec<usize>,
        on_stack: BTreeSet<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let targets: Vec<usize> = s.graph.get(&v).into_iter().flatten().copied().collect();
        for w in targets {
            if !s.index.contains_key(&w) {
                visit(s, w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(&v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(&v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[&v] == s.index[&v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..nodes {
        if !state.index.contains_key(&v) {
            visit(&mut state, v);
        }
    }
    state.out
}

/// Names that mean I/O or a clock.
pub const IO_NAMES: [&str; 11] = [
    "std::fs",
    "fedge_mqtt",
    "axum",
    "std::net",
    "tokio",
    "rumqttc",
    "Instant::now",
    "SystemTime::now",
    "thread::sleep",
    "std::process",
    "File::open",
];

/// The I/O or clock names `file` uses.
pub fn io_names(file: &SourceFile) -> Vec<&'static str> {
    IO_NAMES
        .into_iter()
        .filter(|name| file.code.contains(name))
        .collect()
}
