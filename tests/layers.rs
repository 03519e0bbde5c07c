//! The layers of `src/` point one way (docs/ARCHITECTURE.md): a module names only modules of
//! lower layers, and only `zk/` and `recipes/` talk to ZooKeeper. A source scan, so that a
//! wrong `use` fails here with the file and line instead of eroding the shape unnoticed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module and its layer: a module may name modules of lower layers only.
const LAYERS: &[(&str, u8)] = &[
    // Below everything: a poison-tolerant lock.
    ("locked", 0),
    // Leaves: no module of zkgate below them.
    ("time", 1),
    ("ids", 1),
    ("remembered", 1),
    ("kind", 1),
    ("metrics", 1),
    ("tls", 1),
    ("peer", 1),
    // The HTTP server's accept loop and its bounds (knows nothing of zkgate's routes).
    ("listen", 1),
    // Who may do what (names kinds).
    ("auth", 2),
    // ZooKeeper as such: sessions, watches, names, the embedded server.
    ("zk", 3),
    // The recipes: the only other place that talks to ZooKeeper.
    ("recipes", 4),
    // What an instance keeps on top of the recipes.
    ("lease", 5),
    ("instances", 5),
    ("limits", 5),
    // The event bus (it also follows leases), and the settings of `serve`.
    ("events", 6),
    ("config", 6),
    // The edges: HTTP, the lock runner, and the socket (which serves calls through HTTP).
    ("http", 7),
    ("runner", 7),
    ("ws", 8),
];

/// Modules that may name the composition root's `AppState` (the state axum hands handlers).
const SEE_THE_ROOT: &[&str] = &["http", "ws"];

/// Modules that may not make ZooKeeper requests themselves.
const NO_ZOOKEEPER: &[&str] = &[
    "locked",
    "time",
    "ids",
    "remembered",
    "kind",
    "metrics",
    "tls",
    "peer",
    "listen",
    "auth",
    "lease",
    "instances",
    "events",
    "limits",
    "config",
    "http",
    "runner",
    "ws",
];

/// zookeeper-client's request methods (and zkgate's retrying helper around them).
const REQUESTS: &[&str] = &[
    ".create(",
    ".delete(",
    ".set_data(",
    ".get_data(",
    ".get_and_watch_data(",
    ".check_stat(",
    ".check_and_watch_stat(",
    ".list_children(",
    ".list_and_watch_children(",
    ".get_children(",
    ".get_and_watch_children(",
    ".new_multi_reader(",
    ".new_multi_writer(",
    ".mkdir(",
    ".sync(",
    ".watch(",
    "retry_on_loss(",
    "read_each(",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`None` for the root: lib.rs, main.rs).
fn module_of(path: &Path) -> Option<String> {
    let relative = path.strip_prefix(src()).expect("under src");
    let first = relative.components().next()?.as_os_str().to_string_lossy().into_owned();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
        Some(module) => Some(module.to_string()),
        None => Some(first),
    }
}

/// The code of a file, line by line, without comments and without `#[cfg(test)]` modules
/// (tests may reach anywhere).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let code = line.split("//").next().unwrap_or_default().trim();
            (!code.is_empty()).then(|| (i + 1, code.to_string()))
        })
        .collect()
}

/// The top-level modules a line names through `crate::`.
fn named_modules(line: &str) -> Vec<String> {
    let mut named = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or_default();
            for item in inner.split(',') {
                named.push(item.trim().split("::").next().unwrap_or_default().to_string());
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            named.push(name);
        }
    }
    named.retain(|n| !n.is_empty());
    named
}

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .unwrap_or_else(|| panic!("module `{module}` is missing from LAYERS in tests/layers.rs"))
        .1
}

fn each_file() -> Vec<(String, PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|path| {
            let module = module_of(&path)?;
            let text = std::fs::read_to_string(&path).expect("read");
            Some((module, path, text))
        })
        .collect()
}

#[test]
fn every_module_names_only_lower_layers() {
    let mut wrong = Vec::new();
    for (module, path, text) in each_file() {
        let own = layer(&module);
        for (line_no, line) in code_lines(&text) {
            for named in named_modules(&line) {
                let allowed = match LAYERS.iter().find(|(name, _)| *name == named) {
                    Some(_) if named == module => true,
                    Some((_, target)) => *target < own,
                    // An item of the root: only `AppState`, and only for the handlers.
                    None => SEE_THE_ROOT.contains(&module.as_str()),
                };
                if !allowed {
                    wrong.push(format!(
                        "{}:{line_no}: `{module}` names `{named}`: {line}",
                        path.display()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "layering violations:\n{}", wrong.join("\n"));
}

#[test]
fn only_zk_and_recipes_talk_to_zookeeper() {
    let mut wrong = Vec::new();
    for (module, path, text) in each_file() {
        if !NO_ZOOKEEPER.contains(&module.as_str()) {
            continue;
        }
        for (line_no, line) in code_lines(&text) {
            let request = REQUESTS.iter().find(|r| line.contains(*r));
            // `Leases::create`, `BoundNodes::delete` ... are not ZooKeeper's: only calls on a
            // client count, which these modules never hold.
            let on_client = line.contains("client") || line.contains("retry_on_loss") || line.contains("read_each");
            if let Some(request) = request
                && on_client
            {
                wrong.push(format!(
                    "{}:{line_no}: `{module}` calls `{request}`: {line}",
                    path.display()
                ));
            }
            if line.contains("zookeeper_client::") && !line.contains("zookeeper_client::Error") {
                wrong.push(format!(
                    "{}:{line_no}: `{module}` uses zookeeper_client: {line}",
                    path.display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "ZooKeeper outside zk/ and recipes/:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_is_in_a_layer() {
    let modules: BTreeMap<String, ()> = each_file().into_iter().map(|(m, _, _)| (m, ())).collect();
    for module in modules.keys() {
        layer(module);
    }
}
