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
    // What an operation can answer: the problem catalogue and the one error type (transport-neutral).
    ("problem", 1),
    // The HTTP server's accept loop and its bounds (knows nothing of zkgate's routes).
    ("listen", 1),
    // Who may do what (names kinds); the requests in service and their queue.
    ("auth", 2),
    ("admission", 2),
    // ZooKeeper as such: sessions, watches, names, the embedded server.
    ("zk", 3),
    // The limits on what a client holds and how fast it writes (the recipes refuse by them).
    ("limits", 3),
    // The recipes: the only other place that talks to ZooKeeper.
    ("recipes", 4),
    // The instance registry, on top of the recipes (the leases this instance keeps are
    // `recipes::leases`, beside the engine they keep).
    ("instances", 5),
    // The event bus (it also follows leases), and the settings of `serve`.
    ("events", 6),
    ("config", 6),
    // The served spec's rewriting (the formats of the API's values), below the edge that builds it.
    ("spec", 6),
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
    "problem",
    "time",
    "ids",
    "remembered",
    "kind",
    "metrics",
    "tls",
    "peer",
    "listen",
    "auth",
    "admission",
    "instances",
    "events",
    "limits",
    "config",
    "spec",
    "http",
    "runner",
    "ws",
];

/// The edges: they hand a recipe the whole session (`crate::zk::Session`) and answer what it
/// returns (`crate::zk::Failure` and the recipes' own errors); ZooKeeper's client and its errors
/// are the business of `zk/` and `recipes/`.
const EDGES: &[&str] = &["http", "ws", "runner"];

/// What an edge's statement says of ZooKeeper's client, if it names the client, its errors or
/// its crate, or asks a session for its client.
fn names_the_client(statement: &str) -> Option<&'static str> {
    if statement.contains("zookeeper_client") {
        return Some("the zookeeper_client crate");
    }
    if statement.contains(".client()") {
        return Some("a session's client");
    }
    let words = |s: &str| -> Vec<String> {
        s.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map(str::to_string)
            .collect()
    };
    let mut paths: Vec<String> = if is_use(statement) {
        let tree = statement
            .split_once("use ")
            .map_or("", |(_, t)| t)
            .trim_end_matches(';');
        use_paths(tree)
    } else {
        words(statement)
    };
    paths.retain(|p| p.starts_with("crate::zk::") || p.starts_with("zk::") || p.starts_with("super::"));
    let idents = statement.split(|c: char| !(c.is_alphanumeric() || c == '_'));
    if idents.into_iter().any(|w| w == "ZkError") {
        return Some("ZooKeeper's errors");
    }
    if paths
        .iter()
        .any(|p| p.ends_with("zk::Client") || p.contains("zk::Clientas"))
    {
        return Some("ZooKeeper's client");
    }
    None
}

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

/// The code of a file as [code_lines] has it, with each `use` declaration joined into one
/// entry (at its first line): rustfmt splits a long group over several lines.
fn statements(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open_use = false;
    for (line_no, line) in code_lines(text) {
        if open_use && let Some((_, statement)) = out.last_mut() {
            statement.push_str(&line);
        } else {
            out.push((line_no, line.clone()));
            open_use = is_use(&line);
        }
        if open_use && line.ends_with(';') {
            open_use = false;
        }
    }
    out
}

/// The paths a statement names: a `use` tree's, each whole (`crate::zk::Session`), or the
/// path-like words of any other statement.
fn paths_of(statement: &str) -> Vec<String> {
    if is_use(statement) {
        use_paths(
            statement
                .split_once("use ")
                .map_or("", |(_, t)| t)
                .trim_end_matches(';'),
        )
    } else {
        statement
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map(str::to_string)
            .collect()
    }
}

fn is_use(line: &str) -> bool {
    let line = line
        .strip_prefix("pub(crate) ")
        .or_else(|| line.strip_prefix("pub "))
        .unwrap_or(line);
    line.starts_with("use ")
}

/// Every path a `use` tree names, its groups expanded: `crate::{a::{b, c}, d}` names
/// `crate::a::b`, `crate::a::c` and `crate::d` (whitespace dropped: an `as` alias runs into
/// its path's last segment, which no check reads).
fn use_paths(tree: &str) -> Vec<String> {
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
        match (tree.find('{'), tree.rfind('}')) {
            (Some(open), Some(close)) if open < close => {
                let head = format!("{prefix}{}", &tree[..open]);
                let mut depth = 0;
                let mut start = open + 1;
                for (at, c) in tree[..close].char_indices().skip(open + 1) {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            expand(&head, &tree[start..at], out);
                            start = at + 1;
                        }
                        _ => {}
                    }
                }
                expand(&head, &tree[start..close], out);
            }
            _ if !tree.is_empty() => out.push(format!("{prefix}{tree}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    expand("", tree, &mut out);
    out
}

/// The top-level modules a statement names through `crate::`: every path of a `use` tree, and
/// any `crate::` path in other code.
fn named_modules(statement: &str) -> Vec<String> {
    let first = |path: &str| {
        let name: String = path.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        name
    };
    let mut named = Vec::new();
    if is_use(statement) {
        let tree = statement
            .split_once("use ")
            .map_or("", |(_, tree)| tree)
            .trim_end_matches(';');
        for path in use_paths(tree) {
            if let Some(rest) = path.strip_prefix("crate::") {
                named.push(first(rest));
            }
        }
    } else {
        let mut rest = statement;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or_default();
                named.extend(inner.split(',').map(|item| first(item.trim())));
            } else {
                named.push(first(rest));
            }
        }
    }
    named.retain(|n| !n.is_empty());
    named
}

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(name, _)| *name == module)
        .unwrap_or_else(|| panic!("module `{module}` is missing from LAYERS in tests/it/layers.rs"))
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
        for (line_no, line) in statements(&text) {
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
        for (line_no, line) in statements(&text) {
            let request = REQUESTS.iter().find(|r| line.contains(*r));
            // `Leases::create`, `NodeHoldings::delete` ... are not ZooKeeper's: only calls on a
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
            if line.contains("zookeeper_client") {
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
fn the_edges_hand_recipes_a_session_and_never_touch_its_client() {
    let mut wrong = Vec::new();
    for (module, path, text) in each_file() {
        if !EDGES.contains(&module.as_str()) {
            continue;
        }
        for (line_no, line) in statements(&text) {
            if let Some(what) = names_the_client(&line) {
                wrong.push(format!("{}:{line_no}: `{module}` names {what}: {line}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "an edge reaching past the recipes:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_client_check_sees_every_way_of_naming_it() {
    for text in [
        "use crate::zk::{\n    Session,\n    Client,\n};\n",
        "use crate::zk::ZkError;\n",
        "use crate::zk::{Client as Zk, Session};\n",
        "fn f(c: &crate::zk::Client) {}\n",
        "fn f(e: crate::zk::ZkError) {}\n",
        "let client = session.client();\n",
        "use zookeeper_client::Error;\n",
        "Err(ZkError::NodeExists) => {}\n",
    ] {
        let statements = statements(text);
        assert!(
            statements.iter().any(|(_, s)| names_the_client(s).is_some()),
            "not caught: {text:?}"
        );
    }
    for text in [
        "use crate::zk::{Failure, Session};\n",
        "let session = state.zk().connected().await?;\n",
        "let http = reqwest::Client::new();\n",
    ] {
        let statements = statements(text);
        assert!(
            statements.iter().all(|(_, s)| names_the_client(s).is_none()),
            "wrongly caught: {text:?}"
        );
    }
}

/// The lease-bound engine knows its users only through their `Driver` and `Protocol` (Curator's
/// `LockInternals` knows only a `LockInternalsDriver`): no file of `recipes/engine/` names a
/// recipe built on it, and `recipes/engine/handle/` (under every lease-bound protocol) names
/// no kind.
#[test]
fn the_engine_names_none_of_its_users() {
    // Every module of `recipes/` above the engine: the families and what spans them.
    let users = [
        "locks",
        "elections",
        "barriers",
        "groups",
        "queues",
        "kv",
        "counters",
        "txns",
        "nodes",
        "leases",
        "roles",
        "recorded",
        "holdings",
        "summary",
        "janitor",
    ];
    let mut wrong = Vec::new();
    let mut files = Vec::new();
    rust_files(&src().join("recipes/engine"), &mut files);
    assert!(files.len() > 5, "the engine's files: {files:?}");
    for path in files {
        let file = path.strip_prefix(src()).expect("under src").display().to_string();
        let text = std::fs::read_to_string(&path).expect("read");
        for (line_no, line) in statements(&text) {
            let paths = paths_of(&line);
            for path in paths {
                let segments: Vec<&str> = path.split("::").collect();
                let names_user = segments.windows(2).any(|w| w[0] == "recipes" && users.contains(&w[1]));
                // A kind by name (`Kind::Group`): what differs by kind is said by `Kind` itself
                // (`kind.rs`) or by the user's `Driver`, never decided here.
                let names_kind = path
                    .strip_prefix("Kind::")
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()) && rest != "ALL");
                if names_user || names_kind {
                    wrong.push(format!("src/{file}:{line_no}: {line}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "the engine names its users:\n{}", wrong.join("\n"));
}

/// Multi-ops are built with `zk::Multi`, whose refusals and answers come back by the tag of the
/// operation: outside it, nobody decodes ZooKeeper's index of a refused operation.
#[test]
fn multi_ops_are_built_with_tags_only() {
    let raw = ["new_multi_writer", "MultiWriter", "MultiWriteError", "MultiWriteResult"];
    let mut wrong = Vec::new();
    for (_, path, text) in each_file() {
        if path.ends_with("zk/multi.rs") {
            continue;
        }
        for (line_no, line) in code_lines(&text) {
            if let Some(name) = raw.iter().find(|name| {
                line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .any(|word| word == **name)
            }) {
                wrong.push(format!("{}:{line_no}: {name}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a raw multi-op outside zk::multi:\n{}",
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

#[test]
fn use_trees_are_read_whole() {
    assert_eq!(
        use_paths("crate::{a::{b, c}, d::e}"),
        ["crate::a::b", "crate::a::c", "crate::d::e"]
    );
    let text =
        "use crate::{\n    http::thing,\n    zk::{\n        Client,\n    },\n};\nfn f() { crate::instances::x(); }\n";
    let statements = statements(text);
    assert_eq!(statements.len(), 2, "{statements:?}");
    assert_eq!(named_modules(&statements[0].1), ["http", "zk"]);
    assert_eq!(named_modules(&statements[1].1), ["instances"]);
}

/// A file's module path under `src/`: `recipes/engine/lease.rs` is `recipes::engine::lease`,
/// a folder's `mod.rs` is the folder; `None` for the crate root (lib.rs, main.rs).
fn module_path(path: &Path) -> Option<Vec<String>> {
    let relative = path.strip_prefix(src()).expect("under src");
    let mut segments: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = segments.pop()?;
    match last.strip_suffix(".rs")? {
        "lib" | "main" if segments.is_empty() => None,
        "mod" => Some(segments),
        name => {
            segments.push(name.to_string());
            Some(segments)
        }
    }
}

/// The file that defines module `segments` or, for a path that goes on into an item, the
/// longest prefix of it that is a file's module (`crate::recipes::engine::lease::Lease` is in
/// `recipes/engine/lease.rs`).
fn file_of(segments: &[String]) -> Option<PathBuf> {
    (1..=segments.len()).rev().find_map(|n| {
        let base = src().join(segments[..n].join("/"));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|candidate| candidate.is_file())
    })
}

/// Each line of a file's code with the module it is in: the file's own, or an inline
/// `mod name {` inside it (where `super::` means the file itself).
fn lines_with_depth(text: &str) -> Vec<(usize, String, usize)> {
    let mut inline_closers: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let code: std::collections::HashMap<usize, String> = statements(text).into_iter().collect();
    for (i, raw) in text.lines().enumerate() {
        if inline_closers.last().is_some_and(|closer| raw == closer) {
            inline_closers.pop();
            continue;
        }
        if let Some(statement) = code.get(&(i + 1)) {
            out.push((i + 1, statement.clone(), inline_closers.len()));
        }
        let trimmed = raw.trim_start();
        let opens_inline_mod = trimmed
            .strip_prefix("pub ")
            .unwrap_or(trimmed)
            .strip_prefix("mod ")
            .is_some_and(|rest| rest.ends_with(" {"));
        if opens_inline_mod {
            let indent = &raw[..raw.len() - trimmed.len()];
            inline_closers.push(format!("{indent}}}"));
        }
    }
    out
}

/// The files of `src/` that the file `from` imports, each with the line that names it: every
/// `crate::`, `super::` and `self::` path of its code resolved to the file that defines it.
/// A folder's `mod.rs` handing on what its own files define (`pub use registry::Handles`) is
/// the folder's face, not an import, and the crate root is the composition root: neither is
/// an edge. Anything else a `mod.rs` names of its own folder is (a `mod.rs` that both defines
/// what its files use and calls into them is a circle like any other).
fn imports_of(from: &Path, text: &str) -> Vec<(PathBuf, usize)> {
    let Some(own) = module_path(from) else {
        return Vec::new();
    };
    let is_mod_rs = from.ends_with("mod.rs");
    let mut out = Vec::new();
    for (line_no, statement, inline_depth) in lines_with_depth(text) {
        let paths: Vec<String> = match is_use(&statement) {
            true => paths_of(&statement),
            false => paths_of(&statement)
                .into_iter()
                .filter(|w| w.starts_with("crate::") || w.starts_with("super::") || w.starts_with("self::"))
                .collect(),
        };
        for path in paths {
            let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            let mut module: Vec<String> = match segments.first() {
                Some(&"crate") => {
                    segments.remove(0);
                    Vec::new()
                }
                Some(&"super") | Some(&"self") => {
                    // `self::` in a file is the file's module; each `super::` goes up one,
                    // from the inline module a line is in first.
                    let mut module = own.clone();
                    let mut depth = inline_depth;
                    if segments[0] == "self" {
                        segments.remove(0);
                    }
                    while segments.first() == Some(&"super") {
                        segments.remove(0);
                        if depth > 0 {
                            depth -= 1;
                        } else {
                            module.pop();
                        }
                    }
                    module
                }
                _ => continue,
            };
            module.extend(segments.iter().map(|s| s.to_string()));
            let Some(target) = file_of(&module) else { continue };
            let hands_on = is_mod_rs && is_reexport(&statement) && target.starts_with(from.parent().expect("a folder"));
            if target != from && !hands_on && module_path(&target).is_some() {
                out.push((target, line_no));
            }
        }
    }
    out
}

/// Whether a statement hands an item on (`pub use`, `pub(crate) use`, `pub(super) use`...).
fn is_reexport(statement: &str) -> bool {
    statement.starts_with("pub ") || statement.starts_with("pub(")
}

/// The circles of a graph of files (Tarjan's strongly connected components of more than one
/// file), each with the edges that tie it.
fn circles(edges: &BTreeMap<PathBuf, Vec<(PathBuf, usize)>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<PathBuf, Vec<(PathBuf, usize)>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: std::collections::BTreeSet<&'a PathBuf>,
        found: Vec<Vec<&'a PathBuf>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a PathBuf) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            self.on_stack.insert(node);
            for (next, _) in self.edges.get(node).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top);
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: Default::default(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    let name = |p: &PathBuf| p.strip_prefix(src()).unwrap_or(p).display().to_string();
    walk.found
        .iter()
        .map(|component| {
            let mut ties = Vec::new();
            for from in component {
                for (to, line) in edges.get(*from).into_iter().flatten() {
                    if component.contains(&to) {
                        ties.push(format!("src/{}:{line} -> src/{}", name(from), name(to)));
                    }
                }
            }
            ties.sort();
            ties.dedup();
            ties
        })
        .collect()
}

fn import_graph() -> BTreeMap<PathBuf, Vec<(PathBuf, usize)>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read");
            let imports = imports_of(&path, &text);
            (path, imports)
        })
        .collect()
}

/// No two files of `src/` import each other, directly or round a longer loop: a circle is a
/// room that cannot be read, changed or moved without the others (docs/ARCHITECTURE.md).
#[test]
fn no_import_circle_in_src() {
    let circles = circles(&import_graph());
    assert!(
        circles.is_empty(),
        "import circles in src/ (break each by moving what the lower file needs down to it):\n{}",
        circles
            .iter()
            .map(|ties| ties.join("\n  "))
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

/// The circle check sees a circle through `super::` and through `crate::` paths in code, and
/// not a folder's `mod.rs` handing on its own files' items.
#[test]
fn the_circle_check_reads_imports_as_rust_does() {
    let engine = src().join("recipes/engine");
    let lease = engine.join("lease.rs");
    let record = engine.join("record.rs");
    let handle = engine.join("handle/mod.rs");
    let task = engine.join("handle/task.rs");
    let imports =
        |from: &Path, text: &str| -> Vec<PathBuf> { imports_of(from, text).into_iter().map(|(p, _)| p).collect() };
    assert_eq!(imports(&lease, "use super::record::Found;\n"), vec![record.clone()]);
    assert_eq!(
        imports(&record, "fn f() { crate::recipes::engine::lease::x(); }\n"),
        vec![lease.clone()]
    );
    assert_eq!(
        imports(&task, "use super::{Exit, Handle};\n"),
        [handle.clone(), handle.clone()]
    );
    assert!(imports(&handle, "pub use task::drive;\n").is_empty());
    // A `mod.rs` that uses one of its own files' items (not handing it on) depends on that
    // file, as any file would: the edge that makes a `mod.rs` defining what its files use, and
    // calling into them, a circle.
    assert_eq!(imports(&handle, "use self::task::x;\n"), vec![task.clone()]);
    assert!(imports(&record, "mod inner {\n    use super::EndReason;\n}\n").is_empty());
    let mut graph = BTreeMap::new();
    graph.insert(lease.clone(), vec![(record.clone(), 1)]);
    graph.insert(record.clone(), vec![(lease.clone(), 2)]);
    graph.insert(handle.clone(), vec![(lease.clone(), 3)]);
    let found = circles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 2, "{found:?}");
    graph.remove(&record);
    assert!(circles(&graph).is_empty());
}

/// Modules that may build a znode's path: ZooKeeper's layer, the recipes, and `kind` (every
/// kind's directory). Elsewhere a path comes from the recipe that owns it, so that the layout
/// shared with Curator and kazoo is written down in one place.
const BUILD_ZNODE_PATHS: &[&str] = &["zk", "recipes", "kind"];

/// Whether a statement builds a znode path: a `format!` whose template joins something that
/// names a znode (a root, a directory, a base, a path) with `/`.
fn builds_a_znode_path(statement: &str) -> bool {
    let znode_words = ["root", "dir", "base", "path", "znode"];
    let mut rest = statement;
    while let Some(at) = rest.find("format!(\"") {
        rest = &rest[at + "format!(\"".len()..];
        let Some(end) = rest.find('"') else { break };
        let (template, args) = (&rest[..end], &rest[end..]);
        // A URL's path (`/v1/...`) is no znode's: those are joined onto a root or a directory.
        if template.starts_with('/') {
            continue;
        }
        let Some(join) = template.find("}/") else { continue };
        let Some(open) = template[..join].rfind('{') else {
            continue;
        };
        let named = &template[open + 1..join];
        let first = if named.is_empty() {
            // The positional argument of this `{}`.
            let position = template[..open].matches("{}").count();
            args.trim_start_matches('"')
                .trim_start_matches(',')
                .split(',')
                .nth(position)
                .unwrap_or_default()
        } else {
            named
        };
        if znode_words.iter().any(|w| first.to_lowercase().contains(w)) {
            return true;
        }
    }
    false
}

#[test]
fn znode_paths_are_built_by_recipes_and_zk_only() {
    let mut wrong = Vec::new();
    for (module, path, text) in each_file() {
        if BUILD_ZNODE_PATHS.contains(&module.as_str()) {
            continue;
        }
        for (line_no, line) in statements(&text) {
            if builds_a_znode_path(&line) {
                wrong.push(format!("{}:{line_no}: {line}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a znode path built outside recipes/ and zk/ (ask the recipe that owns it):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_path_check_sees_a_join_and_not_a_url() {
    for built in [
        r#"let path = format!("{}/kv/{key}", state.config.root);"#,
        r#"let path = format!("{dir}/members/{participant}");"#,
        r#"let p = format!("{}/{id}", nodes.dir(name));"#,
        r#"let lock = format!("{root}/reaper");"#,
    ] {
        assert!(builds_a_znode_path(built), "not caught: {built}");
    }
    for fine in [
        r#"let url = format!("{}/docs", running.url());"#,
        r#"let key = format!("{prefix}/{key}");"#,
        r#"let m = format!("no lock `{name}`");"#,
        r#"let url = format!("/v1/queues/{}/dead-letters/{}/replay", path.0, path.1);"#,
    ] {
        assert!(!builds_a_znode_path(fine), "wrongly caught: {fine}");
    }
}

/// The edges keep no state of a recipe's between requests (a round-robin turn, a count): a
/// `static` in `http/`, `ws/` or `runner/` may hold a table computed once, never a lock or an
/// atomic.
#[test]
fn the_edges_keep_no_recipe_state() {
    let mut wrong = Vec::new();
    for (module, path, text) in each_file() {
        if !EDGES.contains(&module.as_str()) {
            continue;
        }
        for (line_no, line) in statements(&text) {
            let is_static = ["static ", "pub static ", "pub(crate) static ", "pub(super) static "]
                .iter()
                .any(|start| line.starts_with(start));
            let mutable = ["Mutex", "RwLock", "Atomic", "RefCell"]
                .iter()
                .any(|w| line.contains(w));
            if is_static && mutable {
                wrong.push(format!("{}:{line_no}: {line}", path.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "state kept by an edge (it belongs to the recipe, held by AppState):\n{}",
        wrong.join("\n")
    );
}

/// The paths of a statement that name the engine or ZooKeeper's layer: `crate::zk::…`,
/// `zk::…`, `crate::recipes::engine::…`, `recipes::engine::…` (and the same in a use tree).
fn names_engine_or_zk(statement: &str) -> Vec<String> {
    paths_of(statement)
        .into_iter()
        .filter(|p| {
            let bare = p.strip_prefix("crate::").unwrap_or(p);
            p == "crate::zk" || bare.starts_with("zk::") || bare.starts_with("recipes::engine")
        })
        .collect()
}

/// The edges (`http/`, `ws/`) name neither the lease-bound engine nor `zk/`, in any file (a
/// `mod.rs` too): a handler parses, calls a recipe's operation and maps what it returns; what
/// it needs of the recipes' vocabulary (a lease, a handle's phase) each family hands on.
#[test]
fn the_edges_name_neither_the_engine_nor_zk() {
    let mut wrong = Vec::new();
    for edge in ["http", "ws"] {
        let mut files = Vec::new();
        rust_files(&src().join(edge), &mut files);
        assert!(
            files.iter().any(|f| f.ends_with("mod.rs")),
            "{edge}/ has a mod.rs: {files:?}"
        );
        for path in files {
            let text = std::fs::read_to_string(&path).expect("read");
            for (line_no, statement) in statements(&text) {
                if !names_engine_or_zk(&statement).is_empty() {
                    let file = path.strip_prefix(src()).expect("under src").display();
                    wrong.push(format!("src/{file}:{line_no}: {statement}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "an edge names the engine or zk/ (ask the family's module for an operation, or for the word it hands on):\n{}",
        wrong.join("\n")
    );
}

/// The edge check sees the engine and `zk/` however a statement names them, and nothing else.
#[test]
fn the_edge_check_sees_the_engine_and_zk_however_named() {
    for named in [
        "use crate::recipes::engine::lease::Lease;",
        "use crate::recipes::{engine::node::NodeHolding, leases::Leases};",
        "use crate::zk::Failure;",
        "use crate::zk;",
        "use crate::{zk::Session, auth::Caller};",
        "let s: crate::zk::Session = x;",
        "fn f(n: &crate::recipes::engine::node::NodeHoldings) {}",
    ] {
        assert!(!names_engine_or_zk(named).is_empty(), "not seen: {named}");
    }
    for fine in [
        "use crate::recipes::leases::Lease;",
        "use crate::recipes::locks::contention::Phase;",
        "let zookeeper = state.zk().status();",
        "connection: zk.connection,",
        "use base64::engine::general_purpose;",
    ] {
        assert!(names_engine_or_zk(fine).is_empty(), "wrongly seen: {fine}");
    }
}
