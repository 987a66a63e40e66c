//! The documentation is one web of pages: README.md (the front door), CONTRIBUTING.md and
//! docs/*.md. Every relative link in them names a file that exists, and every `#anchor` a
//! heading of its page as GitHub makes anchors; the README stays short and shows the command CI
//! runs. Reads files only: no network, no broker.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The pages checked: README.md, CONTRIBUTING.md and every docs/*.md.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap_or_else(|e| panic!("{}: {e}", root.join("docs").display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a Markdown page outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A heading's text as GitHub renders it: code spans, emphasis and link targets gone.
fn rendered(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find("](").and_then(|mid| {
            after[mid + 2..]
                .find(')')
                .map(|end| (mid, mid + 2 + end + 1))
        }) {
            Some((mid, end)) => {
                out.push_str(&after[..mid]);
                rest = &after[end..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace('`', "")
}

/// GitHub's anchor for a heading: its rendered text lowercased, spaces made `-`, and every
/// character other than letters, digits, `-` and `_` removed.
fn anchor(heading: &str) -> String {
    rendered(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings, in order; a repeated one gets `-1`, `-2`, ... as on
/// GitHub.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose(text) {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let rest = &trimmed[hashes..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        // An optional closing sequence of #s.
        let text = rest.trim().trim_end_matches('#').trim_end();
        let base = anchor(text);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// A line with its inline code spans blanked, so a link shown as code is not taken for one.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The link targets of one line: inline links and images `[text](target)` and reference
/// definitions `[label]: target`.
fn targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut found = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some(end) = trimmed.find("]:") {
            if let Some(target) = trimmed[end + 2..].split_whitespace().next() {
                found.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
            }
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let inside = after[..end].trim();
        // Drop an optional title: [text](target "title").
        let target = inside.split_whitespace().next().unwrap_or("");
        found.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    found
}

/// Every broken relative link or anchor of `pages`, as `file:line: link: what is wrong`, with
/// `file` relative to `root`.
fn broken_links(root: &Path, pages: &[PathBuf]) -> Vec<String> {
    let root = root.canonicalize().unwrap();
    let mut anchors_of: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut anchors_for = |path: &Path| -> Vec<String> {
        anchors_of
            .entry(path.to_path_buf())
            .or_insert_with(|| anchors(&std::fs::read_to_string(path).unwrap_or_default()))
            .clone()
    };
    let mut broken = Vec::new();
    for page in pages {
        let text =
            std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let shown = page
            .strip_prefix(&root)
            .unwrap_or(page)
            .display()
            .to_string();
        let dir = page.parent().unwrap();
        for (number, line) in prose(&text) {
            for link in targets(line) {
                let mut fail =
                    |why: String| broken.push(format!("{shown}:{number}: {link}: {why}"));
                if link.is_empty() {
                    fail("an empty link".into());
                    continue;
                }
                if link.contains("://") || link.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = match link.split_once('#') {
                    Some((path, fragment)) => (path, Some(fragment)),
                    None => (link.as_str(), None),
                };
                let target = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                let Ok(target) = target.canonicalize() else {
                    fail(format!("no such file {}", dir.join(path).display()));
                    continue;
                };
                if !target.starts_with(&root) {
                    fail("points outside the repository".into());
                    continue;
                }
                let Some(fragment) = fragment else { continue };
                if target.extension().is_some_and(|ext| ext == "md") {
                    let known = anchors_for(&target);
                    if !known.iter().any(|a| a == fragment) {
                        fail(format!(
                            "no heading with the anchor #{fragment} in {} (its anchors: {})",
                            target.strip_prefix(&root).unwrap().display(),
                            known.join(", ")
                        ));
                    }
                } else if !is_line_anchor(fragment) {
                    fail(format!(
                        "#{fragment} in a file that is not Markdown (only #L<n> or #L<n>-L<m> there)"
                    ));
                }
            }
        }
    }
    broken
}

/// `L12` or `L12-L20`: GitHub's anchors into a source file's lines.
fn is_line_anchor(fragment: &str) -> bool {
    let line = |s: &str| {
        s.strip_prefix('L')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match fragment.split_once('-') {
        Some((from, to)) => line(from) && line(to),
        None => line(fragment),
    }
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo();
    let pages = pages(&root);
    assert!(
        pages.len() > 2,
        "docs/ holds no page: the README's manual lives there"
    );
    let broken = broken_links(&root, &pages);
    assert!(
        broken.is_empty(),
        "{} broken link(s); fix the link or the heading it names:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door_of_at_most_200_lines() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines, more than 200: move the detail into a page of docs/ and link it"
    );
}

/// The commands a CI script runs: its lines that are neither blank, comments, `set` nor `cd`,
/// without a leading `exec`.
fn ci_commands(script: &str) -> Vec<String> {
    script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| !l.starts_with("set ") && !l.starts_with("cd "))
        .map(|l| l.strip_prefix("exec ").unwrap_or(l).trim().to_string())
        .collect()
}

#[test]
fn the_readme_shows_the_test_command_ci_runs() {
    let script = std::fs::read_to_string(repo().join(".ci/run")).unwrap();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let commands = ci_commands(&script);
    assert!(!commands.is_empty(), ".ci/run runs no command");
    // A README line is the command when it is the command, or the command followed by a
    // shell comment.
    let shown: Vec<&str> = readme
        .lines()
        .map(|l| l.split_once(" #").map_or(l, |(command, _)| command).trim())
        .collect();
    for command in commands {
        assert!(
            shown.contains(&command.as_str()),
            "README.md does not show `{command}`, the command .ci/run runs, on a line of its own; \
             put it among the set-up commands (CI must run what the README says)"
        );
    }
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(
        anchor("Checking a mirror: `mirror-maker verify`"),
        "checking-a-mirror-mirror-maker-verify"
    );
    assert_eq!(anchor("7. SIGINT/SIGTERM"), "7-sigintsigterm");
    assert_eq!(
        anchor("kfake (an independent implementation, written in Go)"),
        "kfake-an-independent-implementation-written-in-go"
    );
    assert_eq!(
        anchor("Coming from Java MirrorMaker"),
        "coming-from-java-mirrormaker"
    );
    assert_eq!(
        anchor("snake_case and [a link](x.md)"),
        "snake_case-and-a-link"
    );
    assert_eq!(
        anchors("# A\n\n```\n# not a heading\n```\n## A\n### A ##\n#no\n    # indented code\n"),
        ["a", "a-1", "a-2"]
    );
    assert!(is_line_anchor("L12") && is_line_anchor("L3-L9") && !is_line_anchor("main"));
    assert_eq!(
        ci_commands("#!/bin/sh\n# CI\nset -e\ncd x\nexec ./scripts/test\n"),
        ["./scripts/test"]
    );
}

#[test]
fn a_broken_link_is_reported_with_its_file_line_and_link() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("docs")).unwrap();
    std::fs::write(root.join("docs/b.md"), "# B page\n\n## Twice\n\n## Twice\n").unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n[fine](docs/b.md#twice-1) and [self](#top)\n\
         [gone](docs/none.md)\n\
         [no anchor](docs/b.md#thrice)\n\
         `[in code](nowhere.md)`\n\
         ```\n[in a block](nowhere.md)\n```\n\
         [out](../../outside.md) [web](https://example.com/x#y)\n",
    )
    .unwrap();
    let broken = broken_links(root, &[root.join("README.md"), root.join("docs/b.md")]);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].starts_with("README.md:4: docs/none.md: no such file"));
    assert!(
        broken[1].starts_with("README.md:5: docs/b.md#thrice: no heading with the anchor #thrice"),
        "{}",
        broken[1]
    );
    assert!(broken[2].starts_with("README.md:10: ../../outside.md: "));
}
