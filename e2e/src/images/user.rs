//! The image config's `User` (`uid`, `uid:gid`, `name`, `name:group`), resolved against the
//! image's own `/etc/passwd` and `/etc/group` as a container runtime does.

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UserError {
    #[error("unable to find user {0}: no matching entries in the image's /etc/passwd")]
    NoUser(String),
    #[error("unable to find group {0}: no matching entries in the image's /etc/group")]
    NoGroup(String),
}

/// A user of the image.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageUser {
    pub uid: u32,
    pub gid: u32,
    /// Home directory from `/etc/passwd` (`/` when the user has no entry).
    pub home: String,
}

/// One `/etc/passwd` line: (name, uid, gid, home).
fn passwd_entries(passwd: &str) -> impl Iterator<Item = (&str, u32, u32, &str)> {
    passwd.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 6 {
            return None;
        }
        Some((f[0], f[2].parse().ok()?, f[3].parse().ok()?, f[5]))
    })
}

/// The passwd entry of uid `uid`, if any: its primary gid and home.
pub fn user_by_uid(uid: u32, passwd: &str) -> Option<(u32, String)> {
    passwd_entries(passwd)
        .find(|(_, u, _, _)| *u == uid)
        .map(|(_, _, g, h)| (g, h.to_string()))
}

/// Resolves a config `User` (empty: root). A numeric uid without a passwd entry gets gid 0 and
/// home `/`; a name must exist in `passwd`, a group name in `group`.
pub fn resolve(user: &str, passwd: &str, group: &str) -> Result<ImageUser, UserError> {
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let (uid, primary_gid, home) = if u.is_empty() {
        (
            0,
            0,
            user_by_uid(0, passwd).map_or("/root".into(), |(_, h)| h),
        )
    } else if let Ok(uid) = u.parse::<u32>() {
        let (gid, home) = user_by_uid(uid, passwd).unwrap_or((0, "/".into()));
        (uid, gid, home)
    } else {
        let (_, uid, gid, home) = passwd_entries(passwd)
            .find(|(name, ..)| *name == u)
            .ok_or_else(|| UserError::NoUser(u.to_string()))?;
        (uid, gid, home.to_string())
    };
    let gid = match g {
        None | Some("") => primary_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    (f.len() >= 3 && f[0] == g).then(|| f[2].parse::<u32>().ok())?
                })
                .next()
                .ok_or_else(|| UserError::NoGroup(g.to_string()))?,
        },
    };
    Ok(ImageUser { uid, gid, home })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
        nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n\
        broken line\n\
        app:x:1000:100::/srv/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nusers:x:100:\nnonroot:x:65532:\nbad\n";

    fn user(uid: u32, gid: u32, home: &str) -> ImageUser {
        ImageUser {
            uid,
            gid,
            home: home.into(),
        }
    }

    #[test]
    fn users_resolve_like_a_runtime() {
        let r = |u: &str| resolve(u, PASSWD, GROUP);
        assert_eq!(r(""), Ok(user(0, 0, "/root")));
        assert_eq!(r("65532:65532"), Ok(user(65532, 65532, "/home/nonroot")));
        assert_eq!(r("nonroot"), Ok(user(65532, 65532, "/home/nonroot")));
        assert_eq!(r("app"), Ok(user(1000, 100, "/srv/app")));
        assert_eq!(r("app:nonroot"), Ok(user(1000, 65532, "/srv/app")));
        assert_eq!(r("1000:7"), Ok(user(1000, 7, "/srv/app")));
        assert_eq!(r("4242"), Ok(user(4242, 0, "/")));
        assert_eq!(r("nobody"), Err(UserError::NoUser("nobody".into())));
        assert_eq!(r("app:wheel"), Err(UserError::NoGroup("wheel".into())));
        assert_eq!(resolve("123", "", ""), Ok(user(123, 0, "/")));
        assert_eq!(user_by_uid(1000, PASSWD), Some((100, "/srv/app".into())));
        assert_eq!(user_by_uid(5, PASSWD), None);
    }
}
