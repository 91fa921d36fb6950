//! Where the operator acts: every namespace, or a list of them (`run --namespace a,b`).
//!
//! With a list, the chart grants the namespaced rules of [`crate::permissions`] by a Role in each
//! listed namespace, and a ClusterRole only for what is cluster-scoped (PersistentVolumes,
//! StorageClasses).

use std::collections::BTreeSet;
use std::fmt;

use crate::build::is_dns1123_label;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchScope {
    /// Requests in every namespace (the chart's cluster-wide mode).
    All,
    /// Requests only in these namespaces (never empty).
    Namespaces(BTreeSet<String>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    #[error(
        "invalid namespace {0:?} in --namespace (env WATCH_NAMESPACE): a namespace name is 1 to 63 \
         lower-case letters, digits and '-', starting and ending with a letter or digit"
    )]
    Invalid(String),
    #[error("namespace {0:?} is listed twice in --namespace (env WATCH_NAMESPACE)")]
    Duplicate(String),
}

impl WatchScope {
    /// The scope from `--namespace` values (each may be a comma-separated list, already split by
    /// the flag parser): none, or one empty value (`WATCH_NAMESPACE=""`), means every namespace;
    /// a blank entry in a list is refused as invalid.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Self, ScopeError> {
        if values.is_empty() || matches!(values, [one] if one.as_ref().trim().is_empty()) {
            return Ok(Self::All);
        }
        let mut set = BTreeSet::new();
        for v in values {
            let ns = v.as_ref().trim();
            if !is_dns1123_label(ns) {
                return Err(ScopeError::Invalid(ns.to_string()));
            }
            if !set.insert(ns.to_string()) {
                return Err(ScopeError::Duplicate(ns.to_string()));
            }
        }
        Ok(Self::Namespaces(set))
    }

    /// The namespaces to watch, or `[None]` for every namespace (one `Api::all`).
    pub fn namespaces(&self) -> Vec<Option<&str>> {
        match self {
            Self::All => vec![None],
            Self::Namespaces(set) => set.iter().map(|s| Some(s.as_str())).collect(),
        }
    }

    /// The only namespace watched, if exactly one (the default Lease namespace then).
    pub fn single(&self) -> Option<&str> {
        match self {
            Self::Namespaces(set) if set.len() == 1 => set.iter().next().map(String::as_str),
            _ => None,
        }
    }
}

impl fmt::Display for WatchScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("<all namespaces>"),
            Self::Namespaces(set) => {
                let list: Vec<&str> = set.iter().map(String::as_str).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_namespace_means_all() {
        assert_eq!(WatchScope::parse::<&str>(&[]), Ok(WatchScope::All));
        assert_eq!(WatchScope::parse(&[""]), Ok(WatchScope::All));
        assert_eq!(WatchScope::All.namespaces(), vec![None]);
        assert_eq!(WatchScope::All.single(), None);
    }

    #[test]
    fn a_list_is_sorted_and_single_only_for_one() {
        let s = WatchScope::parse(&["db-b", " db-a"]).unwrap_or(WatchScope::All);
        assert_eq!(s.namespaces(), vec![Some("db-a"), Some("db-b")]);
        assert_eq!(s.single(), None);
        assert_eq!(s.to_string(), "db-a,db-b");
        let one = WatchScope::parse(&["db"]).unwrap_or(WatchScope::All);
        assert_eq!(one.single(), Some("db"));
    }

    #[test]
    fn bad_names_and_duplicates_are_refused_by_name() {
        assert_eq!(
            WatchScope::parse(&["db", ""]),
            Err(ScopeError::Invalid(String::new()))
        );
        for bad in ["Db", "-db", "db-", "db_1", &"a".repeat(64)] {
            assert_eq!(
                WatchScope::parse(&[bad]),
                Err(ScopeError::Invalid(bad.to_string())),
                "{bad:?}"
            );
        }
        assert_eq!(
            WatchScope::parse(&["db", "db"]),
            Err(ScopeError::Duplicate("db".into()))
        );
        let msg = WatchScope::parse(&["Db"]).err().map(|e| e.to_string());
        assert!(msg.is_some_and(|m| m.contains("--namespace") && m.contains("\"Db\"")));
    }
}
