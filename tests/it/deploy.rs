//! The deployment files, checked as far as they can be without Docker: `compose.yaml` is a
//! 3-server ZooKeeper ensemble whose servers agree with each other and with the two zkgate
//! instances, which use the image's port; every `ZKGATE_*` variable in `compose.yaml` and the
//! `Dockerfile` is a flag of `zkgate serve`; the Dockerfile copies only what exists and is not
//! `.dockerignore`d (and everything the crate includes at build time), exposes the port it
//! listens on, runs as a non-root user, and its health check path answers 200 on a running
//! zkgate.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use reqwest::{StatusCode, Url};
use serde_norway::Value as Yaml;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const ZKGATE: &str = env!("CARGO_BIN_EXE_zkgate");

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"))
}

// ---- compose.yaml ----

/// The services of compose.yaml, by name.
fn services() -> BTreeMap<String, Yaml> {
    let compose: Yaml = serde_norway::from_str(&read("compose.yaml")).expect("compose.yaml is YAML");
    let services = compose["services"].as_mapping().expect("a `services` mapping");
    services
        .iter()
        .map(|(name, service)| (scalar(name), service.clone()))
        .collect()
}

/// A scalar as the text compose passes on (`ZOO_MY_ID: 1` is the string `1`).
fn scalar(value: &Yaml) -> String {
    match value {
        Yaml::String(text) => text.clone(),
        Yaml::Number(number) => number.to_string(),
        Yaml::Bool(flag) => flag.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// A service's environment, from either of compose's forms (mapping, or `KEY=VALUE` list).
fn environment(service: &Yaml) -> BTreeMap<String, String> {
    match &service["environment"] {
        Yaml::Mapping(map) => map.iter().map(|(k, v)| (scalar(k), scalar(v))).collect(),
        Yaml::Sequence(list) => list
            .iter()
            .map(|entry| {
                let entry = scalar(entry);
                let (key, value) = entry.split_once('=').unwrap_or((&entry, ""));
                (key.to_string(), value.to_string())
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn zookeepers(services: &BTreeMap<String, Yaml>) -> BTreeMap<&String, &Yaml> {
    services
        .iter()
        .filter(|(_, s)| s["image"].as_str().is_some_and(|i| i.starts_with("zookeeper")))
        .collect()
}

fn zkgates(services: &BTreeMap<String, Yaml>) -> BTreeMap<&String, &Yaml> {
    services.iter().filter(|(_, s)| !s["build"].is_null()).collect()
}

/// `ZOO_SERVERS` (`server.1=zk1:2888:3888;2181 ...`) as id -> (host, client port).
fn parse_zoo_servers(text: &str) -> BTreeMap<u32, (String, u16)> {
    text.split_whitespace()
        .map(|entry| {
            let (key, address) = entry.split_once('=').expect("server.N=...");
            let id = key.strip_prefix("server.").and_then(|id| id.parse().ok());
            let (peers, client) = address.split_once(';').expect("a client port after `;`");
            let host = peers.split(':').next().expect("host");
            let client = client.rsplit(':').next().and_then(|p| p.parse().ok());
            (
                id.unwrap_or_else(|| panic!("bad id in {entry}")),
                (
                    host.to_string(),
                    client.unwrap_or_else(|| panic!("bad port in {entry}")),
                ),
            )
        })
        .collect()
}

/// The `(host, container)` ports of a service's short-syntax `ports`.
fn published_ports(service: &Yaml) -> Vec<(u16, u16)> {
    let ports = service["ports"].as_sequence().expect("ports");
    ports
        .iter()
        .map(|entry| {
            let entry = scalar(entry);
            let numbers: Vec<u16> = entry
                .trim_end_matches("/tcp")
                .rsplit(':')
                .take(2)
                .map(|p| p.parse().unwrap_or_else(|_| panic!("port in {entry}")))
                .collect();
            match numbers[..] {
                [container, host] => (host, container),
                _ => panic!("publish a host port: {entry}"),
            }
        })
        .collect()
}

/// The names in `depends_on` (list or mapping form).
fn depends_on(service: &Yaml) -> BTreeSet<String> {
    match &service["depends_on"] {
        Yaml::Sequence(list) => list.iter().map(scalar).collect(),
        Yaml::Mapping(map) => map.keys().map(scalar).collect(),
        _ => BTreeSet::new(),
    }
}

/// The URL a health check command fetches.
fn url_in(words: impl IntoIterator<Item = String>) -> Url {
    let url = words
        .into_iter()
        .find(|word| word.starts_with("http://"))
        .expect("the health check fetches an http:// URL");
    Url::parse(&url).expect("a URL")
}

fn compose_health_url(service: &Yaml) -> Url {
    match &service["healthcheck"]["test"] {
        Yaml::Sequence(words) => url_in(words.iter().map(scalar)),
        Yaml::String(line) => url_in(line.split_whitespace().map(str::to_string)),
        other => panic!("a healthcheck test: {other:?}"),
    }
}

// ---- Dockerfile ----

/// One Dockerfile instruction: its keyword (upper case) and the rest of it, continuation
/// lines joined.
struct Instruction {
    keyword: String,
    args: String,
}

fn dockerfile() -> Vec<Instruction> {
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in read("Dockerfile").lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(start) => pending.push_str(start),
            None => {
                pending.push_str(line);
                let text = std::mem::take(&mut pending);
                let (keyword, args) = text.trim().split_once(char::is_whitespace).unwrap_or((&text, ""));
                instructions.push(Instruction {
                    keyword: keyword.to_ascii_uppercase(),
                    args: args.trim().to_string(),
                });
            }
        }
    }
    instructions
}

/// The instructions of the last stage (the image that runs).
fn runtime_stage(instructions: &[Instruction]) -> &[Instruction] {
    let last_from = instructions.iter().rposition(|i| i.keyword == "FROM").expect("a FROM");
    &instructions[last_from..]
}

/// `ENV` settings of the runtime stage (`KEY=VALUE ...` or `KEY VALUE`).
fn image_env(instructions: &[Instruction]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for instruction in runtime_stage(instructions).iter().filter(|i| i.keyword == "ENV") {
        if instruction.args.contains('=') {
            for pair in instruction.args.split_whitespace() {
                let (key, value) = pair.split_once('=').expect("KEY=VALUE");
                env.insert(key.to_string(), value.trim_matches('"').to_string());
            }
        } else if let Some((key, value)) = instruction.args.split_once(char::is_whitespace) {
            env.insert(key.to_string(), value.trim().to_string());
        }
    }
    env
}

fn exposed_port(instructions: &[Instruction]) -> u16 {
    let exposed: Vec<u16> = runtime_stage(instructions)
        .iter()
        .filter(|i| i.keyword == "EXPOSE")
        .flat_map(|i| i.args.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .map(|port| port.trim_end_matches("/tcp").parse().expect("a port number"))
        .collect();
    assert_eq!(exposed.len(), 1, "one exposed port: {exposed:?}");
    exposed[0]
}

fn port_of(listen: &str) -> u16 {
    listen
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {listen}"))
}

/// The sources of every `COPY` from the build context (not `--from` another stage).
fn copied_sources(instructions: &[Instruction]) -> Vec<String> {
    let mut sources = Vec::new();
    for copy in instructions
        .iter()
        .filter(|i| i.keyword == "COPY" || i.keyword == "ADD")
    {
        let words: Vec<String> = if copy.args.starts_with('[') {
            serde_json::from_str(&copy.args).expect("COPY [\"src\", ..., \"dest\"]")
        } else {
            copy.args.split_whitespace().map(str::to_string).collect()
        };
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        let paths: Vec<&String> = words.iter().filter(|w| !w.starts_with("--")).collect();
        let (_destination, sources_here) = paths.split_last().expect("COPY src... dest");
        sources.extend(sources_here.iter().map(|s| s.to_string()));
    }
    sources
}

// ---- .dockerignore ----

/// The patterns of `.dockerignore`, as written (comments and blank lines left out).
fn dockerignore() -> Vec<String> {
    std::fs::read_to_string(Path::new(ROOT).join(".dockerignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Whether `.dockerignore`'s `patterns` leave `path` (relative, `/`-separated) out of the
/// build context: the last pattern that matches it, or a directory above it, decides; a
/// pattern starting with `!` takes back in. `*` and `?` match within a path segment, `**` any
/// number of segments.
fn ignored(patterns: &[String], path: &str) -> bool {
    let path: Vec<&str> = path.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    let mut ignored = false;
    for pattern in patterns {
        let (takes_back, pattern) = match pattern.strip_prefix('!') {
            Some(pattern) => (true, pattern),
            None => (false, pattern.as_str()),
        };
        let pattern: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
        if (1..=path.len()).any(|depth| glob(&pattern, &path[..depth])) {
            ignored = !takes_back;
        }
    }
    ignored
}

fn glob(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.split_first(), path.split_first()) {
        (None, None) => true,
        (Some((&"**", rest)), _) => glob(rest, path) || (!path.is_empty() && glob(pattern, &path[1..])),
        (Some((segment, rest)), Some((name, names))) => {
            glob_segment(segment.as_bytes(), name.as_bytes()) && glob(rest, names)
        }
        _ => false,
    }
}

fn glob_segment(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', rest)), _) => glob_segment(rest, name) || (!name.is_empty() && glob_segment(pattern, &name[1..])),
        (Some((b'?', rest)), Some((_, names))) => glob_segment(rest, names),
        (Some((c, rest)), Some((n, names))) => c == n && glob_segment(rest, names),
        _ => false,
    }
}

/// Every file that a source file under `dir` pulls in at compile time
/// (`include_str!` / `include_bytes!`), as a path relative to the repository.
fn compile_time_includes(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            found.extend(compile_time_includes(&path));
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for marker in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                let literal = &rest[..rest.find('"').expect("closing quote")];
                let included = path.parent().expect("parent").join(literal);
                let included = included.canonicalize().expect("the included file exists");
                let root = Path::new(ROOT).canonicalize().expect("root");
                found.push(
                    included
                        .strip_prefix(&root)
                        .expect("inside the repository")
                        .to_path_buf(),
                );
            }
        }
    }
    found
}

// ---- the checks ----

#[test]
fn compose_runs_a_three_server_ensemble_whose_servers_agree() {
    let services = services();
    let zookeepers = zookeepers(&services);
    assert_eq!(zookeepers.len(), 3, "three ZooKeeper servers: {:?}", zookeepers.keys());
    let mut ensembles = BTreeSet::new();
    let mut ids = BTreeMap::new();
    for (name, service) in &zookeepers {
        assert_eq!(service["image"].as_str(), Some("zookeeper:3.9"), "{name}");
        let env = environment(service);
        ensembles.insert(env.get("ZOO_SERVERS").cloned().expect("ZOO_SERVERS"));
        let id: u32 = env
            .get("ZOO_MY_ID")
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("{name}: a numeric ZOO_MY_ID"));
        assert!(ids.insert(id, name.as_str()).is_none(), "ZOO_MY_ID {id} twice");
    }
    assert_eq!(
        ensembles.len(),
        1,
        "every server lists the same ensemble: {ensembles:#?}"
    );
    let servers = parse_zoo_servers(ensembles.first().expect("one"));
    assert_eq!(
        servers.keys().collect::<Vec<_>>(),
        ids.keys().collect::<Vec<_>>(),
        "ZOO_SERVERS lists exactly the servers' ids"
    );
    for (id, (host, _)) in &servers {
        let service = ids[id];
        let hostname = zookeepers[&service.to_string()]["hostname"].as_str();
        assert!(
            host == service || Some(host.as_str()) == hostname,
            "server.{id} is {host}, but ZOO_MY_ID {id} is service {service}"
        );
    }
}

#[test]
fn every_zkgate_in_compose_uses_the_whole_ensemble_and_the_images_port() {
    let services = services();
    let zkgates = zkgates(&services);
    assert_eq!(zkgates.len(), 2, "two zkgate instances: {:?}", zkgates.keys());
    let zookeepers = zookeepers(&services);
    let ensemble = environment(zookeepers.values().next().expect("a ZooKeeper"))["ZOO_SERVERS"].clone();
    let client_addresses: BTreeSet<String> = parse_zoo_servers(&ensemble)
        .values()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect();
    let image_port = exposed_port(&dockerfile());
    let mut host_ports = BTreeSet::new();
    for (name, service) in &zkgates {
        let env = environment(service);
        let connect = env.get("ZKGATE_ZOOKEEPER").expect("ZKGATE_ZOOKEEPER");
        let (servers, _chroot) = connect.split_once('/').unwrap_or((connect, ""));
        let servers: BTreeSet<String> = servers.split(',').map(str::to_string).collect();
        assert_eq!(servers, client_addresses, "{name} connects to every server");

        let listen = env.get("ZKGATE_LISTEN").expect("ZKGATE_LISTEN");
        assert!(
            listen.starts_with("0.0.0.0:"),
            "{name} listens on every interface: {listen}"
        );
        assert_eq!(port_of(listen), image_port, "{name} listens on the image's port");
        let ports = published_ports(service);
        assert_eq!(ports.len(), 1, "{name}: {ports:?}");
        assert_eq!(ports[0].1, image_port, "{name} publishes the port it listens on");
        host_ports.insert(ports[0].0);

        let needs = depends_on(service);
        for zookeeper in zookeepers.keys() {
            assert!(needs.contains(zookeeper.as_str()), "{name} depends on {zookeeper}");
        }
        let health = compose_health_url(service);
        assert_eq!(health.path(), "/readyz", "{name}");
        assert_eq!(
            health.port_or_known_default(),
            Some(image_port),
            "{name}'s health check port"
        );
    }
    assert_eq!(host_ports, BTreeSet::from([7071, 7072]));
}

/// The `ZKGATE_*` variables of `zkgate serve`, from its `--help` (`[env: ZKGATE_LISTEN=]`).
fn serve_flag_variables() -> BTreeSet<String> {
    let output = std::process::Command::new(ZKGATE)
        .args(["serve", "--help"])
        .env_clear()
        .output()
        .expect("run zkgate serve --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout).to_string();
    help.split("[env: ")
        .skip(1)
        .map(|rest| rest[..rest.find(['=', ']']).expect("end of the name")].to_string())
        .collect()
}

/// Every `ZKGATE_...` word in `text`.
fn zkgate_variables(text: &str) -> BTreeSet<String> {
    text.match_indices("ZKGATE_")
        .map(|(at, _)| {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .collect()
}

#[test]
fn every_zkgate_variable_in_the_deployment_files_is_a_flag_of_zkgate_serve() {
    let flags = serve_flag_variables();
    assert!(
        flags.contains("ZKGATE_LISTEN") && flags.contains("ZKGATE_ZOOKEEPER"),
        "{flags:?}"
    );
    // Read by the logger, not a flag; allowed so that a deployment may turn logging up.
    let not_flags = ["ZKGATE_LOG"];
    for file in ["compose.yaml", "Dockerfile"] {
        let named = zkgate_variables(&read(file));
        assert!(!named.is_empty(), "{file} sets zkgate's variables");
        for variable in named {
            assert!(
                flags.contains(&variable) || not_flags.contains(&variable.as_str()),
                "{file} names {variable}, which `zkgate serve` does not read (it has {flags:?})"
            );
        }
    }
}

#[test]
fn the_image_exposes_the_port_it_listens_on_and_checks_readyz() {
    let instructions = dockerfile();
    let port = exposed_port(&instructions);
    let env = image_env(&instructions);
    let listen = env.get("ZKGATE_LISTEN").expect("the image sets ZKGATE_LISTEN");
    assert_eq!(port_of(listen), port, "EXPOSE {port}, ZKGATE_LISTEN={listen}");
    let health = runtime_stage(&instructions)
        .iter()
        .find(|i| i.keyword == "HEALTHCHECK")
        .expect("a HEALTHCHECK");
    let url = url_in(health.args.split_whitespace().map(str::to_string));
    assert_eq!(url.path(), "/readyz");
    assert_eq!(url.port_or_known_default(), Some(port));
}

#[test]
fn the_runtime_stage_runs_as_a_user_that_is_not_root() {
    let instructions = dockerfile();
    let user = runtime_stage(&instructions)
        .iter()
        .rev()
        .find(|i| i.keyword == "USER")
        .map(|i| i.args.split(':').next().unwrap_or_default().to_string())
        .expect("the runtime stage sets a USER");
    assert!(!user.is_empty() && user != "root" && user != "0", "USER {user}");
}

#[test]
fn the_image_has_the_manual_pages_and_completions_the_binary_generates() {
    let instructions = dockerfile();
    // The build stage makes them with the binary it built...
    let made: String = (instructions.iter())
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    for made_by in [
        "zkgate man /out/man1",
        "zkgate completions bash",
        "zkgate completions zsh",
        "zkgate completions fish",
    ] {
        assert!(made.contains(made_by), "the build runs `{made_by}`");
    }
    // ...and the image that runs has them where man and the shells look.
    let copied: Vec<&str> = (runtime_stage(&instructions).iter())
        .filter(|i| i.keyword == "COPY" && i.args.starts_with("--from=build"))
        .map(|i| i.args.as_str())
        .collect();
    for installed in [
        "/usr/share/man/man1/",
        "/usr/share/bash-completion/completions/zkgate",
        "/usr/share/zsh/vendor-completions/_zkgate",
        "/usr/share/fish/vendor_completions.d/zkgate.fish",
    ] {
        assert!(
            copied.iter().any(|copy| copy.ends_with(installed)),
            "the image gets {installed}: {copied:?}"
        );
    }
}

#[test]
fn the_dockerfile_copies_what_exists_and_is_in_the_build_context() {
    let instructions = dockerfile();
    let sources = copied_sources(&instructions);
    assert!(!sources.is_empty());
    let patterns = dockerignore();
    for source in &sources {
        assert!(
            !source.contains(['*', '?', '[']),
            "{source}: teach this test about globs"
        );
        assert!(Path::new(ROOT).join(source).exists(), "COPY {source}: no such file");
        assert!(!ignored(&patterns, source), "COPY {source}: excluded by .dockerignore");
    }
    // What the crate pulls in at compile time must be in the image's build too.
    for included in compile_time_includes(&Path::new(ROOT).join("src")) {
        let included = included.to_str().expect("utf-8");
        assert!(
            sources
                .iter()
                .any(|s| included == s || included.starts_with(&format!("{}/", s.trim_end_matches('/')))),
            "src includes {included}, which the Dockerfile does not copy"
        );
        assert!(!ignored(&patterns, included), "{included}: excluded by .dockerignore");
    }
}

#[test]
fn dockerignore_patterns_match_as_docker_does() {
    let patterns: Vec<String> = ["target", "**/node_modules", "*.md", "!README.md", "docs/*.png"]
        .map(str::to_string)
        .to_vec();
    for (path, expected) in [
        ("target", true),
        ("target/release/zkgate", true),
        ("src/target.rs", false),
        ("tests/browser/node_modules/x.js", true),
        ("BENCHMARKS.md", true),
        ("README.md", false),
        ("docs/dashboard.png", true),
        ("docs/notes.txt", false),
        ("./src", false),
    ] {
        assert_eq!(ignored(&patterns, path), expected, "{path}");
    }
}

#[tokio::test]
async fn the_health_check_path_answers_200_on_a_running_zkgate() {
    let services = services();
    let mut paths: BTreeSet<String> = zkgates(&services)
        .values()
        .map(|service| compose_health_url(service).path().to_string())
        .collect();
    let instructions = dockerfile();
    if let Some(health) = instructions.iter().find(|i| i.keyword == "HEALTHCHECK") {
        paths.insert(
            url_in(health.args.split_whitespace().map(str::to_string))
                .path()
                .to_string(),
        );
    }
    assert_eq!(paths, BTreeSet::from(["/readyz".to_string()]));

    let zk = common::zookeeper().await;
    let gate = common::Gate::start(&zk.connect_string()).await;
    for path in paths {
        let answer = gate.get(&path).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {answer:?}");
    }
}
