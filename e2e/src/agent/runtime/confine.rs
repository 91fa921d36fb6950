//! The confinement of a container process in `container-init` (its [`ProcessSecurity`]), as runc
//! applies an OCI process spec: the bounding set is cut before the uid changes (that needs
//! CAP_SETPCAP), inheritable and ambient sets are cleared, then after the uid change a root
//! process gets the set as permitted and effective capabilities (a non-root one has lost them
//! all with `setuid`), then no_new_privs. The read-only root is a remount of `/` done once per
//! container, before any credential change.

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;

use caps::{CapSet, Capability, CapsHashSet};
use nix::mount::MsFlags;

use super::{ProcessSecurity, RuntimeError};

fn caps_err(what: impl Into<String>) -> impl FnOnce(caps::errors::CapsError) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::Caps {
        what,
        detail: e.to_string(),
    }
}

/// The capabilities named in `names` that the running kernel supports; unknown names are an
/// error (the agent only sends names it knows).
pub(super) fn wanted_caps(names: &[String]) -> Result<CapsHashSet, RuntimeError> {
    let supported = caps::runtime::thread_all_supported();
    let mut out = HashSet::new();
    for n in names {
        let cap = Capability::from_str(n).map_err(|_| RuntimeError::Invalid {
            what: "capability",
            value: n.clone(),
            reason: "unknown",
        })?;
        if supported.contains(&cap) {
            out.insert(cap);
        }
    }
    Ok(out)
}

/// Before the uid/gid change: cut the bounding set to the wanted capabilities, clear the
/// inheritable and ambient sets. Nothing when the spec names no capabilities.
pub(super) fn before_credentials(sec: &ProcessSecurity) -> Result<(), RuntimeError> {
    let Some(names) = &sec.capabilities else {
        return Ok(());
    };
    let wanted = wanted_caps(names)?;
    for cap in caps::runtime::thread_all_supported() {
        if !wanted.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(caps_err(format!("drop {cap} from the bounding set")))?;
        }
    }
    caps::clear(None, CapSet::Inheritable).map_err(caps_err("clear the inheritable set"))?;
    caps::clear(None, CapSet::Ambient).map_err(caps_err("clear the ambient set"))
}

/// After the uid/gid change: a process still running as root keeps exactly the wanted
/// capabilities as effective and permitted sets; any other uid has none left (checked).
/// Then PR_SET_NO_NEW_PRIVS when asked.
pub(super) fn after_credentials(sec: &ProcessSecurity) -> Result<(), RuntimeError> {
    if let Some(names) = &sec.capabilities {
        // Never more than the init holds (an agent that itself runs with fewer capabilities).
        let held =
            caps::read(None, CapSet::Permitted).map_err(caps_err("read the permitted set"))?;
        let wanted: CapsHashSet = wanted_caps(names)?.intersection(&held).copied().collect();
        if nix::unistd::geteuid().is_root() {
            // Effective first: it must stay a subset of permitted at every step.
            caps::set(None, CapSet::Effective, &wanted)
                .map_err(caps_err("set the effective set"))?;
            caps::set(None, CapSet::Permitted, &wanted)
                .map_err(caps_err("set the permitted set"))?;
        } else {
            caps::clear(None, CapSet::Effective).map_err(caps_err("clear the effective set"))?;
            caps::clear(None, CapSet::Permitted).map_err(caps_err("clear the permitted set"))?;
        }
    }
    if sec.no_new_privs {
        nix::sys::prctl::set_no_new_privs().map_err(|source| RuntimeError::Sys {
            what: "prctl(PR_SET_NO_NEW_PRIVS)".into(),
            source,
        })?;
    }
    Ok(())
}

/// Remounts the container's root (the current `/`) read-only; other mounts keep their modes.
pub(super) fn read_only_root() -> Result<(), RuntimeError> {
    nix::mount::mount(
        None::<&str>,
        Path::new("/"),
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(|source| RuntimeError::Sys {
        what: "remount / read-only".into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_names_are_checked() {
        let caps = wanted_caps(&["CAP_CHOWN".into(), "CAP_KILL".into()]).unwrap();
        assert!(caps.contains(&Capability::CAP_CHOWN) && caps.contains(&Capability::CAP_KILL));
        assert_eq!(caps.len(), 2);
        assert!(wanted_caps(&["CAP_NOPE".into()]).is_err());
        assert!(wanted_caps(&[]).unwrap().is_empty());
    }
}
