//! Checks on how the copy Jobs may run: which image (`spec.copy.moverImage` only when the
//! operator allows it) and whether the namespace's Pod Security level admits them.

use std::collections::BTreeMap;

use super::{Denial, DenialReason};
use crate::api::StorageMigrationRequestSpec;
use crate::image::ImageRef;
use crate::labels::POD_SECURITY_ENFORCE_LABEL;

/// A request's own mover image: allowed only with `--allow-request-mover-image`, and then it
/// must be a valid image reference.
pub(super) fn check_mover_image(
    spec: &StorageMigrationRequestSpec,
    allowed: bool,
) -> Result<(), Denial> {
    let Some(image) = &spec.copy.mover_image else {
        return Ok(());
    };
    if !allowed {
        return Err(Denial::new(
            DenialReason::MoverImageNotAllowed,
            format!(
                "spec.copy.moverImage ({image}) is set, but this operator runs its copy Jobs \
                 only with its own image: remove spec.copy.moverImage, or start the operator \
                 with --allow-request-mover-image (Helm value allowRequestMoverImage: true) if \
                 everyone who may create a request may also choose code that runs as root with \
                 the data volumes mounted"
            ),
        ));
    }
    ImageRef::parse(image).map(|_| ()).map_err(|e| {
        Denial::new(
            DenialReason::InvalidSpec,
            format!("spec.copy.moverImage: {e}"),
        )
    })
}

/// The Pod Security levels, as admission names them.
const PRIVILEGED: &str = "privileged";
const BASELINE: &str = "baseline";

/// The namespace's enforced Pod Security level must admit the copy Jobs: `privileged` (or no
/// label) and `baseline` do (the Jobs add only capabilities of baseline's allowed list, and
/// baseline does not restrict the uid); `restricted` refuses capabilities other than
/// NET_BIND_SERVICE and uid 0; an unknown value is evaluated as `restricted` by admission.
pub(super) fn check_pod_security(
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), Denial> {
    let Some(level) = labels.get(POD_SECURITY_ENFORCE_LABEL) else {
        return Ok(());
    };
    if matches!(level.trim(), PRIVILEGED | BASELINE) {
        return Ok(());
    }
    Err(Denial::new(
        DenialReason::PodSecurityLevel,
        format!(
            "namespace {namespace} has label {POD_SECURITY_ENFORCE_LABEL}={level}, which would \
             refuse the copy Jobs: they run as uid 0 with the capabilities CHOWN, \
             DAC_OVERRIDE, FOWNER, FSETID, MKNOD and SETFCAP to keep owners, modes, ACLs and \
             special files, which only the baseline and privileged levels admit; set the \
             label to baseline for the migration (kubectl label --overwrite namespace \
             {namespace} {POD_SECURITY_ENFORCE_LABEL}=baseline) and back afterwards"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mover_image_is_denied_unless_allowed_and_valid() {
        let mut spec = crate::plan::fixtures::spec_class_change("fast");
        assert_eq!(check_mover_image(&spec, false), Ok(()));
        spec.copy.mover_image = Some("registry.test/mine:1".into());
        let d = check_mover_image(&spec, false).unwrap_err();
        assert_eq!(d.reason, DenialReason::MoverImageNotAllowed);
        for part in [
            "spec.copy.moverImage",
            "registry.test/mine:1",
            "--allow-request-mover-image",
            "allowRequestMoverImage",
        ] {
            assert!(d.message.contains(part), "{part} in {}", d.message);
        }
        assert_eq!(check_mover_image(&spec, true), Ok(()));
        spec.copy.mover_image = Some("Bad Image".into());
        let d = check_mover_image(&spec, true).unwrap_err();
        assert_eq!(d.reason, DenialReason::InvalidSpec);
        assert!(d.message.contains("spec.copy.moverImage"), "{}", d.message);
    }

    #[test]
    fn restricted_and_unknown_levels_are_denied_naming_the_label() {
        let labels = |v: &str| BTreeMap::from([(POD_SECURITY_ENFORCE_LABEL.to_string(), v.into())]);
        assert_eq!(check_pod_security("db", &BTreeMap::new()), Ok(()));
        assert_eq!(check_pod_security("db", &labels("privileged")), Ok(()));
        assert_eq!(check_pod_security("db", &labels("baseline")), Ok(()));
        for level in ["restricted", "Restricted", "strict"] {
            let d = check_pod_security("db", &labels(level)).unwrap_err();
            assert_eq!(d.reason, DenialReason::PodSecurityLevel);
            let want = format!("{POD_SECURITY_ENFORCE_LABEL}={level}");
            assert!(d.message.contains(&want), "{}", d.message);
            assert!(d.message.contains("namespace db"), "{}", d.message);
            assert!(d.message.contains("=baseline"), "what to do: {}", d.message);
        }
        // Other pod-security labels (audit, warn, versions) do not matter.
        let mut warn = labels("baseline");
        warn.insert(
            "pod-security.kubernetes.io/warn".into(),
            "restricted".into(),
        );
        assert_eq!(check_pod_security("db", &warn), Ok(()));
    }
}
