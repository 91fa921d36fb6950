//! Node choice (pure): the class's allowed nodes, the selected node or the node with the
//! fewest volumes of the claim's namespace, then the fewest volumes overall.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use crate::provisioner::objects::is_ours;
use crate::provisioner::{LABEL_HOSTNAME, LABEL_NODE};
use crate::state::NODE_NAMES;

/// Nodes of `candidates` that the class's `allowedTopologies` (on `kubernetes.io/hostname`)
/// admit; a class without hostname restrictions admits them all.
pub fn allowed_nodes(class: &StorageClass, candidates: &[&str]) -> Vec<String> {
    let terms = class.allowed_topologies.as_deref().unwrap_or_default();
    let admitted = |node: &str| {
        if terms.is_empty() {
            return true;
        }
        // Terms are ORed; the expressions of one term are ANDed.
        terms.iter().any(|term| {
            term.match_label_expressions
                .as_deref()
                .unwrap_or_default()
                .iter()
                .filter(|req| req.key == LABEL_HOSTNAME)
                .all(|req| req.values.iter().any(|v| v == node))
        })
    };
    candidates
        .iter()
        .filter(|n| admitted(n))
        .map(|n| (*n).to_string())
        .collect()
}

/// The node among `candidates` with the fewest volumes of ours bound to claims of `namespace`,
/// then the fewest volumes of ours overall; ties go to the earliest candidate (the order of
/// [`NODE_NAMES`]). Counting the namespace first spreads the claims of one StatefulSet over the
/// nodes even while the volumes of other namespaces (e.g. an earlier test's, still being
/// deleted) weigh on the totals: a set with a required anti-affinity on the hostname then finds
/// each of its Immediate-bound volumes on a node of its own.
pub fn choose_node(
    candidates: &[String],
    volumes: &[PersistentVolume],
    namespace: &str,
) -> Option<String> {
    let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
    for pv in volumes.iter().filter(|pv| is_ours(pv)) {
        if let Some(node) = pv.labels().get(LABEL_NODE) {
            let entry = counts.entry(node.as_str()).or_default();
            if claim_namespace(pv) == Some(namespace) {
                entry.0 += 1;
            }
            entry.1 += 1;
        }
    }
    candidates
        .iter()
        .enumerate()
        .min_by_key(|(i, n)| (counts.get(n.as_str()).copied().unwrap_or_default(), *i))
        .map(|(_, n)| n.clone())
}

/// The namespace of the claim a PV is bound (or reserved) to.
fn claim_namespace(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.claim_ref.as_ref()?.namespace.as_deref()
}

/// The node to provision a claim's volume on: its selected node (`selected`), which must be one
/// of `candidates` (this cluster's nodes the class admits), else the candidate with the fewest
/// volumes ([`choose_node`], for a claim of `namespace`). `Err` holds the reason for a `ProvisioningFailed` event; it names
/// the node.
pub fn provision_node(
    selected: Option<&str>,
    candidates: &[String],
    volumes: &[PersistentVolume],
    namespace: &str,
    class: &str,
) -> Result<String, String> {
    match selected {
        Some(node) if candidates.iter().any(|c| c == node) => Ok(node.to_string()),
        Some(node) if NODE_NAMES.contains(&node) => Err(format!(
            "selected node {node:?} is not allowed by the allowedTopologies of StorageClass \"{class}\""
        )),
        Some(node) => Err(format!(
            "selected node {node:?} is not a node of this cluster (nodes: {})",
            NODE_NAMES.join(", ")
        )),
        None => choose_node(candidates, volumes, namespace)
            .ok_or_else(|| format!("StorageClass \"{class}\" admits no node of this cluster")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};

    use crate::provisioner::LABEL_HOSTNAME;
    use crate::provisioner::test_support::{class, pv_on};
    use crate::state::NODE_NAMES;

    #[test]
    fn provision_node_takes_the_selected_node_or_the_fewest_volumes() {
        let nodes: Vec<String> = NODE_NAMES.iter().map(|n| n.to_string()).collect();
        let pvs = vec![
            pv_on("p1", "node-a"),
            pv_on("p2", "node-a"),
            pv_on("p3", "node-b"),
        ];
        // No selected node: fewest volumes.
        assert_eq!(
            provision_node(None, &nodes, &pvs, "ns1", "standard").as_deref(),
            Ok("node-c")
        );
        // A selected node wins even when it holds the most volumes.
        assert_eq!(
            provision_node(Some("node-a"), &nodes, &pvs, "ns1", "standard").as_deref(),
            Ok("node-a")
        );
        // Not a node of this cluster: refused, naming it.
        let err = provision_node(Some("node-x"), &nodes, &pvs, "ns1", "standard").unwrap_err();
        assert!(err.contains("\"node-x\""), "{err}");
        assert!(err.contains("not a node of this cluster"), "{err}");
        // Ours, but excluded by the class's allowedTopologies: refused, naming it.
        let only_c = vec!["node-c".to_string()];
        let err = provision_node(Some("node-a"), &only_c, &pvs, "ns1", "standard").unwrap_err();
        assert!(err.contains("\"node-a\""), "{err}");
        assert!(err.contains("allowedTopologies"), "{err}");
        // No candidate at all.
        let err = provision_node(None, &[], &pvs, "ns1", "standard").unwrap_err();
        assert!(err.contains("admits no node"), "{err}");
    }

    #[test]
    fn node_choice_prefers_fewest_volumes_with_stable_ties() {
        let nodes: Vec<String> = NODE_NAMES.iter().map(|n| n.to_string()).collect();
        assert_eq!(choose_node(&nodes, &[], "ns1").as_deref(), Some("node-a"));
        let pvs = vec![pv_on("p1", "node-a")];
        assert_eq!(choose_node(&nodes, &pvs, "ns1").as_deref(), Some("node-b"));
        let pvs = vec![pv_on("p1", "node-a"), pv_on("p2", "node-b")];
        assert_eq!(choose_node(&nodes, &pvs, "ns1").as_deref(), Some("node-c"));
        let pvs = vec![
            pv_on("p1", "node-a"),
            pv_on("p2", "node-b"),
            pv_on("p3", "node-c"),
            pv_on("p4", "node-a"),
        ];
        assert_eq!(choose_node(&nodes, &pvs, "ns1").as_deref(), Some("node-b"));
        // PVs of other provisioners do not count.
        let mut foreign = pv_on("p5", "node-a");
        foreign.metadata.annotations = None;
        assert_eq!(
            choose_node(&nodes, &[foreign], "ns1").as_deref(),
            Some("node-a")
        );
        assert_eq!(choose_node(&[], &[], "ns1"), None);
    }

    /// A volume of ours bound to a claim of namespace `ns`.
    fn pv_of(name: &str, node: &str, ns: &str) -> PersistentVolume {
        let mut pv = pv_on(name, node);
        if let Some(cref) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            cref.namespace = Some(ns.into());
        }
        pv
    }

    #[test]
    fn the_claims_of_one_namespace_spread_over_the_nodes_whatever_the_totals() {
        let nodes: Vec<String> = NODE_NAMES.iter().map(|n| n.to_string()).collect();
        // An earlier namespace's volumes, still being deleted: node-b is the emptiest overall.
        let mut pvs = vec![
            pv_of("old1", "node-a", "old"),
            pv_of("old2", "node-a", "old"),
            pv_of("old3", "node-c", "old"),
        ];
        // Three claims of a new namespace, provisioned one after the other, land on three
        // nodes: by totals alone the second would go to node-b again (b 1, c 1, a 2).
        let mut chosen = Vec::new();
        for i in 0..3 {
            let node = choose_node(&nodes, &pvs, "new").unwrap();
            pvs.push(pv_of(&format!("new{i}"), &node, "new"));
            chosen.push(node);
        }
        assert_eq!(chosen, ["node-b", "node-c", "node-a"]);
        // Within the namespace's own counts, ties still go to the fewest overall.
        assert_eq!(
            choose_node(&nodes, &pvs, "other").as_deref(),
            Some("node-b")
        );
    }

    #[test]
    fn allowed_topologies_restrict_nodes() {
        let mut c = class("standard", "Immediate");
        assert_eq!(allowed_nodes(&c, &NODE_NAMES).len(), 3);
        c.allowed_topologies = Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: LABEL_HOSTNAME.into(),
                values: vec!["node-c".into(), "node-x".into()],
            }]),
        }]);
        assert_eq!(allowed_nodes(&c, &NODE_NAMES), vec!["node-c".to_string()]);
    }
}
