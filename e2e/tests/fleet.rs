//! End-to-end scenario of many requests at once under the operator's copy caps: five
//! single-member `Generic` StatefulSets in two namespaces, one request each, all created
//! together, moved by one operator watching both namespaces with `--max-copies 2`.
//!
//! While they run, the test samples both namespaces every 200 ms: the copy Jobs not finished
//! (pre-copy, final copy, verify) and the members holding a slot by their requests' statuses
//! (`PreCopying` to `Copying`). It asserts:
//! - every request ends `Successful`, its claim on the new class;
//! - never more than 2 copy Jobs running at once, nor more than 2 members holding a slot;
//! - the cap was used (2 at once at some point) and held someone: a request waited with the
//!   condition `CopySlot` `False` naming the cap and the holders, then took a slot (`True`).
//!
//! Run: `KUBECONFIG=DIR/kubeconfig cargo test -p e2e --test fleet`

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e::testing::fleet::{ONE_MEMBER_SCRIPT, Seen, request_name, sample_until_final};
use e2e::testing::operator::{Operator, create_request, install_crd, summary};
use e2e::testing::{assert_claims_bound, one_member_set, scenario};
use serde_json::json;
use storage_migrator::api::{MemberStep, Phase, StorageMigrationRequest, conditions};

const CAP: usize = 2;
/// The sets: in the first namespace three, in the second two.
const FIRST: [&str; 3] = ["app-a", "app-b", "app-c"];
const SECOND: [&str; 2] = ["app-d", "app-e"];
const ALL_FINAL: Duration = Duration::from_secs(900);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_sets_in_two_namespaces_never_copy_more_than_the_cap_at_once() {
    let (cluster, one) = scenario("smr-fleet-one").await;
    let (_, two) = scenario("smr-fleet-two").await;
    install_crd(&one).await.unwrap();
    let spaces = [(&one, &FIRST[..]), (&two, &SECOND[..])];
    for (ns, sets) in spaces {
        for set in sets {
            let s = one_member_set(
                set,
                &cluster.mover_image,
                &cluster.storage_class,
                "64Mi",
                ONE_MEMBER_SCRIPT,
            );
            ns.create_statefulset_ready(&s).await.unwrap();
        }
    }
    let cap = CAP.to_string();
    let _op = Operator::start_watching(&one, &[&two], 0, &["--max-copies", &cap])
        .await
        .unwrap();
    for (ns, sets) in spaces {
        for set in sets {
            let spec = json!({
                "type": "StorageClassChange",
                "target": {"kind": "StatefulSet", "name": set},
                "storageClassChange": {"storageClassName": cluster.wffc_storage_class},
                "timeout": "15m",
                "database": {"engine": "Generic"},
            });
            create_request(ns, &format!("move-{set}"), spec)
                .await
                .unwrap();
        }
    }
    let deadline = Instant::now() + ALL_FINAL;
    let expected = FIRST.len() + SECOND.len();
    let (seen, requests) = sample_until_final(&[&one, &two], expected, deadline)
        .await
        .unwrap();
    println!("NOTE fleet of 5 under --max-copies {CAP}: {seen:?}");
    for r in &requests {
        let status = r.status.clone().unwrap_or_default();
        assert_eq!(status.phase, Phase::Successful, "{}", summary(r));
    }
    for (ns, sets) in spaces {
        for set in sets {
            for (claim, (_, class, _)) in assert_claims_bound(ns, set, 1).await {
                assert_eq!(class, cluster.wffc_storage_class, "{claim}'s class");
            }
        }
    }
    assert!(seen.most_jobs <= CAP, "copy Jobs over the cap: {seen:?}");
    assert!(seen.most_holders <= CAP, "slots over the cap: {seen:?}");
    assert_eq!(seen.most_holders, CAP, "the cap was used: {seen:?}");
    assert!(
        !seen.waited.is_empty(),
        "some request waited for a slot: {seen:?}"
    );
    for (request, message) in &seen.waited {
        assert!(
            message.contains(&format!(
                "waits for a copy slot: {CAP} of at most {CAP} copies in the cluster are running: "
            )),
            "{request}: {message}"
        );
    }
    took_a_slot_after_waiting(&requests, &seen);
}

/// Every request that waited ends with `CopySlot` `True` (it took a slot), and its member Done.
fn took_a_slot_after_waiting(requests: &[StorageMigrationRequest], seen: &Seen) {
    let waited: BTreeSet<&str> = seen.waited.iter().map(|(n, _)| n.as_str()).collect();
    for r in requests {
        let name = request_name(r);
        let status = r.status.clone().unwrap_or_default();
        let slot = conditions::get(&status.conditions, conditions::COPY_SLOT);
        assert!(
            slot.is_some_and(|c| c.status == "True" && c.reason == "Taken"),
            "{name} took a slot (waited: {}): {slot:?}",
            waited.contains(name.as_str())
        );
        assert!(
            status.members.iter().all(|m| m.step == MemberStep::Done),
            "{}",
            summary(r)
        );
    }
}
