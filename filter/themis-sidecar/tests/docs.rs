//! The operator's guide lists every reason a sidecar refuses for, and nothing else:
//! `docs/FILTER.md`'s two reason tables against the code's (both ways).

use std::collections::BTreeSet;

use themis_sidecar::reason::{Reason, Rejection};

const FILTER_MD: &str = include_str!("../../../docs/FILTER.md");

/// The first column of the table whose header row is `| reason | <header> |`.
fn documented(header: &str) -> BTreeSet<String> {
    let head = format!("| reason | {header} |");
    let start = FILTER_MD
        .find(&head)
        .unwrap_or_else(|| panic!("docs/FILTER.md has no table {head:?}"));
    FILTER_MD[start..]
        .lines()
        .skip(2) // the header and the |---| row
        .take_while(|line| line.starts_with('|'))
        .map(|row| {
            let cell = row.split('|').nth(1).unwrap_or_default().trim();
            cell.trim_matches('`').to_string()
        })
        .collect()
}

fn assert_same(table: &str, code: BTreeSet<String>, docs: BTreeSet<String>) {
    let undocumented: Vec<_> = code.difference(&docs).collect();
    let unreal: Vec<_> = docs.difference(&code).collect();
    assert!(
        undocumented.is_empty() && unreal.is_empty(),
        "{table}: not in docs/FILTER.md {undocumented:?}; in the docs but no reason of the code {unreal:?}"
    );
}

#[test]
fn every_connection_refusal_is_documented_and_every_documented_one_is_real() {
    let code = Reason::ALL.iter().map(|r| r.as_str().to_string()).collect();
    assert_same(
        "refused.<reason>",
        code,
        documented("why the connection was closed"),
    );
}

#[test]
fn every_request_rejection_is_documented_and_every_documented_one_is_real() {
    let code = Rejection::ALL
        .iter()
        .map(|r| r.as_str().to_string())
        .collect();
    assert_same(
        "rejected.<reason>",
        code,
        documented("why the request was answered by the sidecar"),
    );
}
