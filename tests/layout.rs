//! The module layout holds: no module imports one from a layer above its own, no import
//! circle among the crate's files (brace imports read too), every module map (`src/lib.rs`, each
//! `mod.rs`) names all its modules, the data path's two wings never import each other, and
//! `unsafe` is allowed only on the FFI modules. (The compiler enforces `unsafe_code = "deny"` elsewhere;
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
            // main.rs is the binary; a `tests.rs` is a module's unit tests, not a module of
            // the layout.
            if parts == ["main"] || parts.last().is_some_and(|p| p == "tests") {
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

/// The paths a `use` tree names from the start of `rest` (just after `crate::` or `super::`):
/// `a::b` names itself, `a::{b, c::{d, e}}` names `a::b`, `a::c::d` and `a::c::e`.
fn use_paths(rest: &str) -> Vec<String> {
    let path: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let after = rest[path.len()..].trim_start();
    if !(path.is_empty() || path.ends_with("::")) || !after.starts_with('{') {
        return vec![path.trim_end_matches(':').to_owned()];
    }
    // The brace group, up to its matching `}`, split at its top-level commas.
    let mut depth = 0;
    let mut items = vec![String::new()];
    for c in after[1..].chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().unwrap().push(c);
    }
    items
        .iter()
        .map(|item| item.trim())
        .filter(|item| !item.is_empty())
        .flat_map(|item| use_paths(item).into_iter().map(|p| format!("{path}{p}")))
        .collect()
}

/// The modules `code` (of module `name`) names through `crate::` or `super::`, brace groups
/// included.
fn imports(name: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let parent = name.rsplit_once("::").map_or("", |(p, _)| p);
    for (prefix, base) in [("crate::", ""), ("super::", parent)] {
        for (at, _) in code.match_indices(prefix) {
            // `super::super::x`: read from the last `super::`.
            if prefix == "super::" && code[..at].ends_with("super::") {
                continue;
            }
            for path in use_paths(&code[at + prefix.len()..]) {
                let mut base: Vec<&str> = base.split("::").filter(|s| !s.is_empty()).collect();
                let mut path = path.as_str();
                while let Some(rest) = path.strip_prefix("super::") {
                    base.pop();
                    path = rest;
                }
                let mut full = base;
                full.extend(path.split("::").filter(|s| !s.is_empty() && *s != "self"));
                // The longest prefix that is a module.
                while !full.is_empty() && !known.contains(&full.join("::")) {
                    full.pop();
                }
                let target = full.join("::");
                // A module composes its children: its imports of them are not edges. A
                // child's import of its parent is (`mapping::ledger` naming `mapping`'s items
                // while `mapping` names `state`, which names `mapping::ledger`, is a circle).
                if !target.is_empty() && target != name && !target.starts_with(&format!("{name}::"))
                {
                    found.insert(target);
                }
            }
        }
    }
    found
}

#[test]
fn brace_imports_are_read() {
    let known: BTreeSet<String> = [
        "mirror",
        "mirror::a",
        "mirror::b",
        "mirror::c",
        "mirror::c::d",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let code = "use super::{a::X, b};\nuse crate::mirror::{c::{d::Y, Z}};";
    let found = imports("mirror::e", code, &known);
    let expected: BTreeSet<String> = ["mirror::a", "mirror::b", "mirror::c", "mirror::c::d"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, expected);
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
fn every_map_names_all_its_modules() {
    let modules = modules();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    for name in modules.keys().filter(|m| !m.is_empty()) {
        // The map of a module's parent: src/lib.rs, or the parent's mod.rs.
        let (parent, child) = name.rsplit_once("::").unwrap_or(("", name));
        let map = if parent.is_empty() {
            src.join("lib.rs")
        } else {
            src.join(parent.replace("::", "/")).join("mod.rs")
        };
        let text = std::fs::read_to_string(&map).unwrap();
        if !text.contains(&format!("[`{child}`]")) && !text.contains(&format!("::{child}`]")) {
            missing.push(format!("{} does not name {name}", map.display()));
        }
    }
    assert!(missing.is_empty(), "module maps out of date: {missing:#?}");
}

/// The guarantee wings of the data path: neither imports the other; what both need lives in
/// `mirror` itself.
const WINGS: [&str; 3] = [
    "mirror::at_least_once",
    "mirror::exactly_once",
    "mirror::batches",
];

#[test]
fn the_wings_never_import_each_other() {
    let modules = modules();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    let wing = |m: &str| {
        WINGS
            .iter()
            .position(|w| m == *w || m.starts_with(&format!("{w}::")))
    };
    let mut crossing = Vec::new();
    for (name, code) in &modules {
        let Some(own) = wing(name) else { continue };
        for target in imports(name, code, &known) {
            if wing(&target).is_some_and(|other| other != own) {
                crossing.push(format!("{name} imports {target}"));
            }
        }
    }
    assert!(
        crossing.is_empty(),
        "one wing imports the other: {crossing:#?}"
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
