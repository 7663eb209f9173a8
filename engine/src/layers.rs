//! The layer check: reads every `crate::` and `super::` path in `engine/src` and fails on an
//! import against the layer order below, or on a cycle between the modules of the table.
//!
//! A module belongs to the longest entry of [`LAYERS`] that is a prefix of its path; it may
//! use paths into its own entry and into entries below it, never above. The crate root
//! (`lib.rs`, the facade) is exempt: it re-exports from every layer, and a `crate::Name`
//! path through one of its re-exports counts as a path to where the name comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom to top. One entry per line; a module may import only from its own
/// entry and the entries before it in this list (the layers below it). `limits` is the
/// bottom (every limit, importing nothing); `storage::coding` (the checked byte
/// reader/writer and file-name parser) sits under every storage format that uses it.
const LAYERS: &[&str] = &[
    "limits",
    "session",
    "error",
    "storage::io",
    "storage::coding",
    "storage::frame",
    "storage::catalog",
    "storage::manifest",
    "storage::segment",
    "storage::multi",
    "storage::commit",
    "storage::run",
    "storage::index",
    "storage::recovery",
    "storage",
    "store",
    "spill",
    "exchange",
    "derive",
    "compaction",
    "fuzzing",
];

/// One import found in a source file.
#[derive(Debug, Clone)]
struct Import {
    file: PathBuf,
    line: usize,
    from: Vec<String>,
    target: Vec<String>,
}

/// A violation of the layer order, as the test reports it.
fn describe(import: &Import, from_layer: &str, to_layer: &str) -> String {
    format!(
        "{}:{}: `{}` (layer `{from_layer}`) imports `crate::{}` (layer `{to_layer}`, above it)",
        import.file.display(),
        import.line,
        import.from.join("::"),
        import.target.join("::"),
    )
}

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("engine/src is readable");
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file: `storage/io/sim.rs` is `storage::io::sim`,
/// `storage/mod.rs` is `storage`, `lib.rs` is the root (empty).
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).expect("file under engine/src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    match last.as_str() {
        "mod.rs" | "lib.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_owned()),
    }
    parts
}

/// The text with comments removed (line comments, doc comments included), keeping line
/// breaks so that positions still name the right line.
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(start) => &line[..start],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_identifier_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Parses `::a::b::{c, d::{e, f}}` (after a `crate` or `super` keyword) into full paths,
/// each relative to that keyword; returns the paths and where parsing stopped.
fn parse_tree(bytes: &[u8], mut position: usize, prefix: &[String]) -> (Vec<Vec<String>>, usize) {
    let mut path = prefix.to_vec();
    loop {
        if bytes[position..].starts_with(b"::") {
            position += 2;
        } else {
            return (vec![path], position);
        }
        while position < bytes.len() && bytes[position].is_ascii_whitespace() {
            position += 1;
        }
        if position < bytes.len() && bytes[position] == b'{' {
            return parse_group(bytes, position + 1, &path);
        }
        let start = position;
        while position < bytes.len() && is_identifier_byte(bytes[position]) {
            position += 1;
        }
        if start == position {
            // `::*` or `::<`: the path ends here.
            return (vec![path], position);
        }
        path.push(String::from_utf8_lossy(&bytes[start..position]).into_owned());
    }
}

/// Parses the members of a `{..}` group up to its closing brace.
fn parse_group(bytes: &[u8], mut position: usize, prefix: &[String]) -> (Vec<Vec<String>>, usize) {
    let mut paths = Vec::new();
    loop {
        while position < bytes.len()
            && (bytes[position].is_ascii_whitespace() || bytes[position] == b',')
        {
            position += 1;
        }
        if position >= bytes.len() || bytes[position] == b'}' {
            return (paths, position + 1);
        }
        let start = position;
        while position < bytes.len() && is_identifier_byte(bytes[position]) {
            position += 1;
        }
        let name = String::from_utf8_lossy(&bytes[start..position]).into_owned();
        if name.is_empty() {
            // `*` or another token: skip it.
            position += 1;
            continue;
        }
        let mut member = prefix.to_vec();
        if name != "self" {
            member.push(name);
        }
        if bytes[position] == b'{' {
            let (nested, next) = parse_group(bytes, position + 1, &member);
            paths.extend(nested);
            position = next;
            continue;
        }
        let (nested, next) = parse_tree(bytes, position, &member);
        paths.extend(nested);
        position = next;
        // Skip an `as alias`.
        while position < bytes.len() && !matches!(bytes[position], b',' | b'}') {
            position += 1;
        }
    }
}

/// The inline modules of a file (`mod tests { .. }`): name and byte span of their body.
/// Braces inside string and character literals are skipped.
fn inline_modules(text: &str) -> Vec<(String, usize, usize)> {
    let bytes = text.as_bytes();
    let mut modules = Vec::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("mod ") {
        let start = from + found;
        from = start + 4;
        if start > 0 && is_identifier_byte(bytes[start - 1]) {
            continue;
        }
        let mut position = from;
        while position < bytes.len() && is_identifier_byte(bytes[position]) {
            position += 1;
        }
        let name = text[from..position].to_owned();
        while position < bytes.len() && bytes[position] == b' ' {
            position += 1;
        }
        if name.is_empty() || position >= bytes.len() || bytes[position] != b'{' {
            continue;
        }
        let body = position;
        let mut depth = 0usize;
        while position < bytes.len() {
            match bytes[position] {
                b'"' => {
                    position += 1;
                    while position < bytes.len() && bytes[position] != b'"' {
                        position += if bytes[position] == b'\\' { 2 } else { 1 };
                    }
                }
                b'\'' if position + 2 < bytes.len() && bytes[position + 2] == b'\'' => {
                    position += 2;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            position += 1;
        }
        modules.push((name, body, position));
    }
    modules
}

/// Every `crate::` and `super::` path of a file, made absolute.
fn imports_of(root: &Path, file: &Path) -> Vec<Import> {
    let text = strip_comments(&std::fs::read_to_string(file).expect("source is readable"));
    let bytes = text.as_bytes();
    let file_module = module_path(root, file);
    let inline = inline_modules(&text);
    let mut imports = Vec::new();
    for keyword in ["crate", "super"] {
        let mut from = 0;
        while let Some(found) = text[from..].find(keyword) {
            let start = from + found;
            from = start + keyword.len();
            let before_ok = start == 0 || !is_identifier_byte(bytes[start - 1]);
            if !before_ok || !bytes[from..].starts_with(b"::") {
                continue;
            }
            if start >= 2 && &bytes[start - 2..start] == b"::" {
                // `super::super::`: handled from the first `super`.
                continue;
            }
            // The module the path is written in: the file's, or an inline module inside it.
            let mut module = file_module.clone();
            for (name, body_start, body_end) in &inline {
                if (*body_start..*body_end).contains(&start) {
                    module.push(name.clone());
                }
            }
            let base = match keyword {
                "crate" => Vec::new(),
                // `super` is the parent of this module (of the directory module for `mod.rs`).
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            let (paths, _) = parse_tree(bytes, from, &base);
            let line = text[..start].matches('\n').count() + 1;
            for mut target in paths {
                // Resolve a chain of `super`s.
                let mut resolved = Vec::new();
                for part in target.drain(..) {
                    if part == "super" {
                        resolved.pop();
                    } else {
                        resolved.push(part);
                    }
                }
                imports.push(Import {
                    file: file.strip_prefix(root).unwrap_or(file).to_path_buf(),
                    line,
                    from: file_module.clone(),
                    target: resolved,
                });
            }
        }
    }
    imports
}

/// The index in [`LAYERS`] of the longest entry that is a prefix of `path`.
fn layer_of(path: &[String]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (index, entry) in LAYERS.iter().enumerate() {
        let parts: Vec<&str> = entry.split("::").collect();
        let matches = parts.len() <= path.len() && parts.iter().zip(path).all(|(a, b)| a == b);
        if matches && best.is_none_or(|(_, length)| parts.len() > length) {
            best = Some((index, parts.len()));
        }
    }
    best.map(|(index, _)| index)
}

/// Where the crate root's re-exports come from: `Store` is `store::Store`, etc.
fn root_reexports(root: &Path) -> BTreeMap<String, Vec<String>> {
    let text = strip_comments(&std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs"));
    let mut names = BTreeMap::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("pub use ") {
        let start = from + found + "pub use ".len();
        from = start;
        let bytes = text.as_bytes();
        let mut end = start;
        while end < bytes.len() && is_identifier_byte(bytes[end]) {
            end += 1;
        }
        let first = vec![text[start..end].to_owned()];
        let (paths, _) = parse_tree(bytes, end, &first);
        for path in paths {
            if let Some(last) = path.last() {
                names.insert(last.clone(), path.clone());
            }
        }
    }
    names
}

/// The imports of every file in `engine/src` (the root's own excepted), targets resolved
/// through the root's re-exports.
fn all_imports() -> Vec<Import> {
    let root = source_root();
    let reexports = root_reexports(&root);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files.sort();
    let mut imports = Vec::new();
    for file in files {
        for mut import in imports_of(&root, &file) {
            if import.from.is_empty() {
                continue;
            }
            if let Some(first) = import.target.first() {
                if let Some(origin) = reexports.get(first) {
                    let rest: Vec<String> = import.target[1..].to_vec();
                    import.target = origin.clone();
                    import.target.extend(rest);
                }
            }
            imports.push(import);
        }
    }
    imports
}

/// The violations of the layer order among `imports`.
fn violations(imports: &[Import]) -> Vec<String> {
    let mut problems = Vec::new();
    for import in imports {
        let Some(from_layer) = layer_of(&import.from) else {
            problems.push(format!(
                "{}: module `{}` is in no layer of the table",
                import.file.display(),
                import.from.join("::")
            ));
            continue;
        };
        let Some(to_layer) = layer_of(&import.target) else {
            problems.push(format!(
                "{}:{}: `crate::{}` is in no layer of the table",
                import.file.display(),
                import.line,
                import.target.join("::")
            ));
            continue;
        };
        if to_layer > from_layer {
            problems.push(describe(import, LAYERS[from_layer], LAYERS[to_layer]));
        }
    }
    problems
}

/// A cycle among the layer entries, if the imports make one: the entries along it.
fn find_cycle(imports: &[Import]) -> Option<Vec<&'static str>> {
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for import in imports {
        if let (Some(from), Some(to)) = (layer_of(&import.from), layer_of(&import.target)) {
            if from != to {
                edges.entry(from).or_default().insert(to);
            }
        }
    }
    // Depth-first search; a node met again on the current path closes a cycle.
    fn visit(
        node: usize,
        edges: &BTreeMap<usize, BTreeSet<usize>>,
        path: &mut Vec<usize>,
        done: &mut BTreeSet<usize>,
    ) -> Option<Vec<usize>> {
        if let Some(start) = path.iter().position(|&on_path| on_path == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node);
            return Some(cycle);
        }
        if done.contains(&node) {
            return None;
        }
        path.push(node);
        for &next in edges.get(&node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    for &node in edges.keys() {
        if let Some(cycle) = visit(node, &edges, &mut Vec::new(), &mut done) {
            return Some(cycle.into_iter().map(|index| LAYERS[index]).collect());
        }
    }
    None
}

#[test]
fn every_import_points_down_the_layer_table() {
    let imports = all_imports();
    assert!(
        imports.len() > 100,
        "the scan found only {} imports: the parser is broken",
        imports.len()
    );
    let problems = violations(&imports);
    assert!(
        problems.is_empty(),
        "imports against the layer order (lib.rs and engine/src/layers.rs list it):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_layers_have_no_cycle() {
    let imports = all_imports();
    let cycle = find_cycle(&imports);
    assert!(cycle.is_none(), "import cycle between layers: {cycle:?}");
}

#[test]
fn the_check_catches_an_upward_import_and_a_cycle() {
    let upward = Import {
        file: PathBuf::from("storage/frame.rs"),
        line: 1,
        from: vec!["storage".into(), "frame".into()],
        target: vec!["store".into(), "Store".into()],
    };
    let problems = violations(std::slice::from_ref(&upward));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("layer `storage::frame`"),
        "{problems:?}"
    );
    let downward = Import {
        file: PathBuf::from("store/mod.rs"),
        line: 1,
        from: vec!["store".into()],
        target: vec!["storage".into(), "frame".into(), "Record".into()],
    };
    assert!(violations(std::slice::from_ref(&downward)).is_empty());
    let cycle = find_cycle(&[upward, downward]);
    assert_eq!(
        cycle,
        Some(vec!["storage::frame", "store", "storage::frame"])
    );
}

#[test]
fn grouped_and_relative_paths_are_expanded() {
    let text = b"::store::{self, Event, read::{walk, get as fetch}}, x";
    let (paths, _) = parse_tree(text, 0, &[]);
    let joined: Vec<String> = paths.iter().map(|path| path.join("::")).collect();
    assert_eq!(
        joined,
        [
            "store",
            "store::Event",
            "store::read::walk",
            "store::read::get"
        ]
    );
}
