//! The add-a-recipe checklist, enforced: every `Kind` is walked through every place a kind
//! must be registered that the compiler does not hold (a `match` on `Kind` without a wildcard
//! already fails the build for a kind it misses: the summary, the janitor's leftovers, the
//! registries of lease-bound kinds, waiting counts), and docs/ARCHITECTURE.md's list names
//! every file this test reads.

use std::path::Path;

use serde_json::Value;
use zkgate::kind::Kind;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(file: &str) -> String {
    std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The files a new kind must touch, beyond those a `match` on `Kind` makes the compiler name.
/// docs/ARCHITECTURE.md's "Adding a recipe" names each of them.
const CHECKED_FILES: &[&str] = &[
    "src/kind.rs",
    "src/http/mod.rs",
    "scripts/schemathesis_fixtures.py",
    "tests/it/main.rs",
    "tests/it/bad_input.rs",
    "web/index.html",
    "README.md",
];

/// The operations scripts/schemathesis_fixtures.py makes a new thing for after each success.
fn renewed_fixtures() -> Vec<String> {
    let output = std::process::Command::new("python3")
        .current_dir(repo().join("scripts"))
        .args(["-c", "import schemathesis_fixtures as f; print('\\n'.join(f.RENEWED))"])
        .output()
        .expect("python3 runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect()
}

/// What a kind misses, for each place it must be in.
fn missing(kind: Kind, spec: &Value, fixtures: &[String], texts: &Texts) -> Vec<String> {
    let segment = kind.segment();
    let base = format!("/v1/{segment}");
    let paths = spec["paths"].as_object().expect("paths");
    let mut missing = Vec::new();
    let mut need = |ok: bool, what: String| {
        if !ok {
            missing.push(what);
        }
    };
    // Routes: its list, and operations on one resource.
    need(
        paths.get(&base).is_some_and(|p| p.get("get").is_some()),
        format!("routes: `GET {base}` (its list) in the spec"),
    );
    need(
        paths.keys().any(|p| p.starts_with(&format!("{base}/{{"))),
        format!("routes: operations on `{base}/{{name}}` in the spec"),
    );
    // Its tag, described.
    let tags = spec["tags"].as_array().expect("tags");
    need(
        tags.iter()
            .any(|t| t["name"] == kind.tag() && t["description"].as_str().is_some_and(|d| !d.is_empty())),
        format!(
            "spec tags: `{}` with a description (its RESOURCE's `about`)",
            kind.tag()
        ),
    );
    // Its event stream, if it has a topic.
    if kind.topic().is_some() {
        need(
            paths.keys().any(|p| {
                p.strip_prefix(&format!("{base}/{{"))
                    .is_some_and(|rest| rest.ends_with("}/events") && !rest[..rest.len() - 8].contains('/'))
            }),
            format!("topics: `GET {base}/{{name}}/events` (an `events_handler!` line)"),
        );
    }
    // A fixture for every operation that uses a thing up.
    for (path, operations) in paths.iter().filter(|(p, _)| p.starts_with(&format!("{base}/"))) {
        if operations.get("delete").is_some() {
            let operation = format!("DELETE {path}");
            need(
                fixtures.contains(&operation),
                format!("fixtures: `{operation}` in scripts/schemathesis_fixtures.py's RENEWED"),
            );
        }
    }
    // Its tests (in its family's folder where it has one), and its hostile inputs.
    let file = tests_of(kind);
    let (folder, stem) = file.rsplit_once('/').map_or(("", file), |(f, s)| (f, s));
    let stem = stem.trim_end_matches(".rs");
    let declared = if folder.is_empty() {
        texts.main.contains(&format!("\nmod {stem};"))
    } else {
        texts.main.contains(&format!("\nmod {folder};"))
            && std::fs::read_to_string(repo().join(format!("tests/it/{folder}/mod.rs")))
                .is_ok_and(|m| m.contains(&format!("\nmod {stem};")))
    };
    need(
        repo().join(format!("tests/it/{file}")).is_file() && declared,
        format!("tests: tests/it/{file}, declared in tests/it/main.rs (and its folder's mod.rs)"),
    );
    need(
        texts.bad_input.contains(&format!("{base}/")),
        format!("hostile input: a case of `{base}/...` in tests/it/bad_input.rs"),
    );
    // The dashboard (a kind with a topic has a section) and the README.
    if kind.topic().is_some() {
        need(
            texts.dashboard.contains(&format!("'{segment}'")) || texts.dashboard.contains(&format!("\"{segment}\"")),
            format!("dashboard: `{segment}` in web/index.html"),
        );
    }
    need(
        texts.readme.contains(&format!("$Z{base}")),
        format!("README: a walkthrough calling `$Z{base}...`"),
    );
    missing
}

struct Texts {
    main: String,
    bad_input: String,
    dashboard: String,
    readme: String,
}

#[test]
fn every_kind_is_in_every_registry() {
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let fixtures = renewed_fixtures();
    let texts = Texts {
        main: read("tests/it/main.rs"),
        bad_input: read("tests/it/bad_input.rs"),
        dashboard: read("web/index.html"),
        readme: read("README.md"),
    };
    let mut wrong = Vec::new();
    for kind in Kind::ALL {
        for what in missing(kind, &spec, &fixtures, &texts) {
            wrong.push(format!("{kind}: {what}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "kinds missing from a registry (docs/ARCHITECTURE.md, Adding a recipe):\n{}",
        wrong.join("\n")
    );
    // Fixtures of operations that are no more.
    let paths = spec["paths"].as_object().expect("paths");
    for operation in &fixtures {
        let (method, path) = operation.split_once(' ').expect("METHOD path");
        assert!(
            paths.get(path).is_some_and(|p| p.get(method.to_lowercase()).is_some()),
            "a fixture for `{operation}`, which the spec does not have"
        );
    }
}

/// The check catches a kind that misses each place (a spec without its routes, tag and stream,
/// texts without its tests, fixtures, dashboard and walkthrough).
#[test]
fn the_checklist_catches_a_kind_left_out() {
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let mut bare = spec.clone();
    let paths = bare["paths"].as_object_mut().expect("paths");
    paths.retain(|p, _| !p.starts_with("/v1/locks"));
    paths.insert(
        "/v1/locks/{name}/handles/{handle}".into(),
        serde_json::json!({"delete": {}}),
    );
    bare["tags"] = serde_json::json!([]);
    let texts = Texts {
        main: String::new(),
        bad_input: String::new(),
        dashboard: String::new(),
        readme: String::new(),
    };
    let found = missing(Kind::Lock, &bare, &[], &texts);
    for what in [
        "routes: `GET",
        "spec tags",
        "topics",
        "fixtures",
        "tests:",
        "hostile input",
        "dashboard",
        "README",
    ] {
        assert!(
            found.iter().any(|m| m.starts_with(what)),
            "not caught: {what} in {found:?}"
        );
    }
    // And the same kind with everything in place is whole.
    let whole = Texts {
        main: read("tests/it/main.rs"),
        bad_input: read("tests/it/bad_input.rs"),
        dashboard: read("web/index.html"),
        readme: read("README.md"),
    };
    assert_eq!(
        missing(Kind::Lock, &spec, &renewed_fixtures(), &whole),
        Vec::<String>::new()
    );
}

/// Where a kind's tests are, as the recipes' families are folded (`tests/it/locks/` as
/// `src/recipes/locks/`); no wildcard, so a new kind must say.
fn tests_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "locks/exclusive.rs",
        Kind::RwLock => "locks/rwlocks.rs",
        Kind::Semaphore => "locks/semaphores.rs",
        Kind::Election => "elections.rs",
        Kind::Barrier => "barriers/barrier.rs",
        Kind::DoubleBarrier => "barriers/double.rs",
        Kind::Txn => "txns.rs",
        Kind::Queue => "queues.rs",
        Kind::Group => "groups/group.rs",
        Kind::Service => "groups/service.rs",
        Kind::Kv => "kv/keys.rs",
        Kind::Counter => "counters.rs",
    }
}

/// docs/ARCHITECTURE.md's checklist names every file the checks above read.
#[test]
fn the_architecture_checklist_names_every_checked_file() {
    let doc = read("docs/ARCHITECTURE.md");
    let section = doc
        .split("## Adding a recipe")
        .nth(1)
        .expect("an 'Adding a recipe' section");
    for file in CHECKED_FILES {
        assert!(
            section.contains(file),
            "docs/ARCHITECTURE.md's checklist does not name {file}"
        );
    }
}
