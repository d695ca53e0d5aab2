//! The book and the code say the same: the hand-kept lists of the docs are checked against
//! what they list (every error code with its status, every backend kind with its page, every
//! fuzz target), so a new code, kind or target cannot land undocumented.

use std::collections::BTreeSet;
use std::path::Path;

use turnstile::error::ErrorCode;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

#[test]
fn the_error_table_lists_every_code_with_its_status() {
    // `ErrorCode::ALL` holds every variant of the enum.
    let source = read("src/error.rs");
    let start = source.find("pub enum ErrorCode {").unwrap();
    let body = &source[start..start + source[start..].find('}').unwrap()];
    let variant = |l: &str| {
        let l = l.trim();
        l.ends_with(',') && l.starts_with(|c: char| c.is_ascii_uppercase())
    };
    let variants = body.lines().filter(|l| variant(l)).count();
    assert_eq!(
        variants,
        ErrorCode::ALL.len(),
        "ErrorCode::ALL misses a variant"
    );

    let http = read("docs/src/http.md");
    let rows: BTreeSet<(String, u16)> = http
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let code = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((code.to_string(), cells.get(2)?.parse().ok()?))
        })
        .collect();
    let codes: BTreeSet<(String, u16)> = ErrorCode::ALL
        .iter()
        .map(|c| (c.as_str().to_string(), c.status()))
        .collect();
    assert_eq!(rows, codes, "docs/src/http.md's error table");
}

#[test]
fn every_backend_kind_has_its_page_and_is_named_where_kinds_are_listed() {
    let (summary, intro) = (
        read("docs/src/SUMMARY.md"),
        read("docs/src/introduction.md"),
    );
    let backend_doc = read("src/backend/mod.rs");
    for kind in turnstile::config::KIND_NAMES {
        let page = format!("backends/{kind}.md");
        assert!(!read(&format!("docs/src/{page}")).is_empty());
        assert!(summary.contains(&page), "SUMMARY.md links {page}");
        assert!(intro.contains(&page), "introduction.md links {page}");
        assert!(
            backend_doc.contains(&format!("`{kind}`")),
            "BackendInfo::kind's doc names `{kind}`"
        );
    }
}

#[test]
fn every_fuzz_target_is_run_and_documented() {
    let targets: BTreeSet<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets"))
            .unwrap()
            .map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".rs").unwrap().to_string()
            })
            .collect();
    let script = read(".ci/fuzz.sh");
    let listed = script
        .lines()
        .find_map(|l| l.strip_prefix("targets=("))
        .and_then(|l| l.strip_suffix(')'))
        .unwrap();
    let run: BTreeSet<String> = listed.split_whitespace().map(String::from).collect();
    assert_eq!(run, targets, ".ci/fuzz.sh runs every target");
    let (testing, cargo) = (read("docs/src/testing.md"), read("fuzz/Cargo.toml"));
    for t in &targets {
        assert!(
            testing.contains(&format!("`{t}`")),
            "testing.md names `{t}`"
        );
        assert!(
            cargo.contains(&format!("name = \"{t}\"")),
            "fuzz/Cargo.toml has `{t}`"
        );
    }
}

#[test]
fn the_architecture_page_stays_short() {
    // A codemap read in one sitting: what does not fit belongs in the book.
    let len = read("ARCHITECTURE.md").len();
    assert!(
        len <= 15_000,
        "ARCHITECTURE.md is {len} bytes (at most 15,000)"
    );
}
