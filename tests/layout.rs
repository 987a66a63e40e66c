//! The module layout holds: no module imports one from a layer above its own, no import
//! circle among the crate's files, `src/lib.rs`'s map names every module, and `unsafe` is
//! allowed only on the FFI modules. (The compiler enforces `unsafe_code = "deny"` elsewhere;
//! this test keeps the allowances themselves from spreading.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers of `src/lib.rs`, lowest first.
const LAYERS: &[(&str, u8)] = &[
    ("native", 1),
    ("plugin", 2),
    ("settings", 3),
    ("mirror", 4),
    ("ops", 5),
    ("tools", 5),
];

/// Every library module, by path (`mirror::stream`), with its source minus comments and
/// test modules.
fn modules() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts == ["main"] {
                continue;
            }
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code: String = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            out.insert(parts.join("::"), code);
        }
    }
    out
}

/// The modules `code` (of module `name`) names through `crate::` or `super::`.
fn imports(name: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let parent = name.rsplit_once("::").map_or("", |(p, _)| p);
    for (prefix, base) in [("crate::", ""), ("super::", parent)] {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut full: Vec<&str> = base.split("::").filter(|s| !s.is_empty()).collect();
            full.extend(path.split("::").filter(|s| !s.is_empty()));
            // The longest prefix that is a module.
            while !full.is_empty() && !known.contains(&full.join("::")) {
                full.pop();
            }
            let target = full.join("::");
            if !target.is_empty() && target != name && !name.starts_with(&format!("{target}::")) {
                found.insert(target);
            }
        }
    }
    found
}

fn layer(module: &str) -> u8 {
    let top = module.split("::").next().unwrap_or("");
    LAYERS
        .iter()
        .find(|(m, _)| *m == top)
        .map_or(0, |(_, l)| *l)
}

#[test]
fn no_module_imports_one_from_a_layer_above_it() {
    let modules = modules();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let mut upward = Vec::new();
    for (name, code) in &modules {
        if name.is_empty() {
            continue; // lib.rs declares them all
        }
        for target in imports(name, code, &known) {
            if layer(&target) > layer(name) {
                upward.push(format!("{name} imports {target}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports going up a layer: {upward:#?}");
}

#[test]
fn there_is_no_import_circle() {
    let modules = modules();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let graph: BTreeMap<&str, BTreeSet<String>> = modules
        .iter()
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, code)| (name.as_str(), imports(name, code, &known)))
        .collect();
    // Depth-first search for a back edge.
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<&str, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut circle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        let circle = visit(node, &graph, &mut Vec::new(), &mut done);
        assert!(circle.is_none(), "import circle: {circle:?}");
    }
}

#[test]
fn the_module_map_names_every_module() {
    let modules = modules();
    let full =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let missing: Vec<&String> = modules
        .keys()
        .filter(|m| !m.is_empty() && !full.contains(&format!("[`{m}`]")))
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's map does not name {missing:?}"
    );
}

#[test]
fn unsafe_is_allowed_only_on_the_ffi_modules() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let allowed: Vec<&str> = lib
        .split("#[allow(unsafe_code)]")
        .skip(1)
        .filter_map(|after| after.split_whitespace().nth(2))
        .map(|m| m.trim_end_matches(';'))
        .collect();
    assert_eq!(allowed, ["native", "plugin"]);
    for (name, code) in modules() {
        if name.is_empty() {
            continue;
        }
        assert!(
            !code.contains("allow(unsafe_code)"),
            "{name} allows unsafe code itself"
        );
    }
}
