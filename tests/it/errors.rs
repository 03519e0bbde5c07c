//! The README's tables of errors say what the code answers: every problem of the catalogue is
//! in them with its status, and nothing else is.

use std::collections::BTreeSet;

use zkgate::http::error::{Channel, Problem};

const README: &str = include_str!("../../README.md");

/// The rows of the first table after `heading` whose header starts with `first_column`: each
/// row's cells.
fn table(heading: &str, first_column: &str) -> Vec<Vec<String>> {
    let section = &README[README.find(heading).unwrap_or_else(|| panic!("README has `{heading}`"))..];
    let start = section
        .find(&format!("| {first_column}"))
        .unwrap_or_else(|| panic!("a table under `{heading}`"));
    section[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The backticked words of a cell.
fn slugs(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn the_readme_lists_every_http_problem_with_its_status() {
    let listed: BTreeSet<(u16, String)> = table("## Errors", "status")
        .iter()
        .flat_map(|row| {
            let status: u16 = row[0].parse().expect("a status");
            slugs(&row[1]).into_iter().map(move |slug| (status, slug))
        })
        .collect();
    let catalogue: BTreeSet<(u16, String)> = Problem::ALL
        .iter()
        .filter(|p| p.channel() == Channel::Http)
        .map(|p| (p.status().as_u16(), p.slug().to_string()))
        .collect();
    assert_eq!(
        listed, catalogue,
        "README `## Errors` against the catalogue (src/http/error/mod.rs)"
    );
}

#[test]
fn the_readme_lists_every_socket_problem() {
    let listed: BTreeSet<String> = table("## WebSocket", "`type`")
        .iter()
        .flat_map(|row| slugs(&row[0]))
        .collect();
    for problem in Problem::ALL.iter().filter(|p| p.channel() == Channel::Socket) {
        assert!(
            listed.contains(problem.slug()),
            "`{}` is not in the WebSocket errors",
            problem.slug()
        );
    }
    for slug in &listed {
        assert!(
            Problem::ALL.iter().any(|p| p.slug() == slug),
            "the WebSocket errors name `{slug}`, which the catalogue does not have"
        );
    }
}
