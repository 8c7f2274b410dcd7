//! User and group names of ids, for messages (`uid 60001, alice`). The
//! lookups go through the C library (`getpwuid_r`, `getgrgid_r`), so that
//! names from NSS (LDAP, systemd's dynamic users) are found too: rustix
//! makes system calls only and has no such lookup.

/// The name of user `uid`, or the number when it has none.
pub fn user_name(uid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to memory owned here for the call's duration.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return uid.to_string();
    }
    // SAFETY: on success pw_name points into `buf`, NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) }
        .to_string_lossy()
        .into_owned()
}

/// The name of group `gid`, or the number when it has none.
pub fn group_name(gid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer refers to memory owned here for the call's duration.
    let rc = unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return gid.to_string();
    }
    // SAFETY: on success gr_name points into `buf`, NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(grp.gr_name) }
        .to_string_lossy()
        .into_owned()
}
