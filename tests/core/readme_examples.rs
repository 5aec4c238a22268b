//! Every Rust example in README.md is code that is compiled and run elsewhere: its lines, in
//! order, are code of a rustdoc example (which `cargo test --doc` runs) or of a program in
//! `examples/` (which `cargo test` builds), whatever their layout. The README may leave lines
//! out (setup, clean-up, an assertion), never change or add one: an example edited in the
//! README alone, or a renamed call left in it, fails here.

use std::path::Path;

/// Where the README's examples come from: files whose rustdoc examples count, and programs.
const DOC_SOURCES: [&str; 3] = ["src/lib.rs", "actors/engine.rs", "actors/storage.rs"];

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The ```rust blocks of a Markdown text: the line number of each fence and its lines.
fn rust_blocks(md: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, Vec<String>)> = None;
    for (i, line) in md.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match current.take() {
            Some(block) if fence => out.push(block),
            Some(mut block) => {
                block.1.push(line.to_string());
                current = Some(block);
            }
            None if fence && line.trim() == "```rust" => current = Some((i + 1, Vec::new())),
            None => {}
        }
    }
    out
}

/// The code examples of the doc comments (`///`, `//!`) of a Rust source that rustdoc
/// compiles (a fence with no language or `rust`; not `text`, `ignore`, ...), each as its
/// lines, hidden lines (`# ...`) included as rustdoc compiles them.
fn doc_examples(src: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // Inside a fenced block: `Some(lines)` for one rustdoc compiles, `None` for another.
    let mut current: Option<Option<Vec<String>>> = None;
    for line in src.lines() {
        let t = line.trim_start();
        let Some(doc) = t.strip_prefix("///").or_else(|| t.strip_prefix("//!")) else {
            continue;
        };
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        let fence = doc.trim_start().starts_with("```");
        match current.take() {
            Some(block) if fence => out.extend(block),
            Some(Some(mut block)) => {
                let code = match doc {
                    "#" => "",
                    d => d.strip_prefix("# ").unwrap_or(d),
                };
                block.push(code.to_string());
                current = Some(Some(block));
            }
            Some(None) => current = Some(None),
            None if fence => {
                let compiled = matches!(doc.trim(), "```" | "```rust");
                current = Some(compiled.then(Vec::new));
            }
            None => {}
        }
    }
    out
}

/// `code` without its layout: no whitespace, and no comma before a closing bracket (what
/// rustfmt adds to a list it splits over lines).
fn squash(code: &str) -> String {
    let mut s: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    for (from, to) in [(",)", ")"), (",]", "]"), (",}", "}")] {
        while s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

/// The first line of `block` (blank lines skipped) not found, in order, in `source`, both
/// without their layout ([`squash`]: the README may lay a call out on one line that rustfmt
/// splits in the source); `None` when every one is.
fn missing_line<'a>(block: &'a [String], source: &[String]) -> Option<&'a str> {
    let text = squash(&source.join("\n"));
    let mut at = 0;
    for line in block.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        let want = squash(line);
        match text[at..].find(&want) {
            Some(i) => at += i + want.len(),
            None => return Some(line),
        }
    }
    None
}

#[test]
fn every_readme_example_is_compiled_code() {
    let readme = read("README.md");
    let mut sources: Vec<(String, Vec<String>)> = Vec::new();
    for file in DOC_SOURCES {
        let src = read(file);
        // Only examples that rustdoc compiles (no `ignore`/`text` fence) count.
        assert!(
            !src.contains("```ignore"),
            "{file}: an example rustdoc ignores"
        );
        for (i, ex) in doc_examples(&src).into_iter().enumerate() {
            sources.push((format!("{file}, doc example {}", i + 1), ex));
        }
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let src = std::fs::read_to_string(&path).unwrap();
            sources.push((
                path.display().to_string(),
                src.lines().map(str::to_string).collect(),
            ));
        }
    }
    let blocks = rust_blocks(&readme);
    assert!(
        blocks.len() >= 4,
        "README.md: {} Rust examples",
        blocks.len()
    );
    for (line, block) in &blocks {
        let found = sources
            .iter()
            .any(|(_, src)| missing_line(block, src).is_none());
        if !found {
            // The source that matches the most, and the line it lacks.
            let (name, miss) = sources
                .iter()
                .map(|(name, src)| (name, missing_line(block, src).unwrap_or("")))
                .max_by_key(|(_, miss)| block.iter().position(|l| l.trim() == *miss).unwrap_or(0))
                .unwrap();
            panic!(
                "README.md line {line}: this example is no compiled code's; closest: {name}, \
                 which lacks (in order) the line {miss:?}"
            );
        }
    }
}

#[test]
fn a_changed_line_is_found() {
    let source: Vec<String> = ["let a = 1;", "let b = 2;", "assert_eq!(a + 1, b);"]
        .map(String::from)
        .to_vec();
    let same: Vec<String> = ["let a = 1;", "", "assert_eq!(a + 1, b);"]
        .map(String::from)
        .to_vec();
    assert_eq!(missing_line(&same, &source), None);
    let changed: Vec<String> = ["let a = 1;", "let b = 3;"].map(String::from).to_vec();
    assert_eq!(missing_line(&changed, &source), Some("let b = 3;"));
    let reordered: Vec<String> = ["let b = 2;", "let a = 1;"].map(String::from).to_vec();
    assert_eq!(missing_line(&reordered, &source), Some("let a = 1;"));
    // Laid out differently (rustfmt's split and trailing comma): the same code.
    let split: Vec<String> = ["f(", "    a,", "    b,", ");"].map(String::from).to_vec();
    let one = vec!["f(a, b);".to_string()];
    assert_eq!(missing_line(&one, &split), None);
    assert_eq!(
        missing_line(&["f(b, a);".to_string()], &split),
        Some("f(b, a);")
    );
    let md = "text\n```rust\nlet a = 1;\n```\n```sh\nls\n```\n";
    assert_eq!(rust_blocks(md), [(2, vec!["let a = 1;".to_string()])]);
    let src = "/// ```text\n/// not code\n/// ```\n/// ```\n/// # fn main() {\n/// let a = 1;\n/// #\n/// # }\n/// ```\nfn f() {}\n";
    assert_eq!(
        doc_examples(src),
        [["fn main() {", "let a = 1;", "", "}"]
            .map(String::from)
            .to_vec()]
    );
}
