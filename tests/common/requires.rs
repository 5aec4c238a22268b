//! For tests whose scenario needs what a machine may lack (root, a mount, a tmpfs, `setpriv`).

/// Called where a test cannot run its scenario (`why` says what is missing): fails the test when
/// `OMNIBUS_TEST_STRICT` is set to anything but `0` (`.ci/run` sets it: CI runs as root on a
/// machine that has all of it, so there a skip would hide a test that never ran); elsewhere it
/// says so on stderr and the caller returns.
pub fn cannot_run(why: &str) {
    let strict = std::env::var_os("OMNIBUS_TEST_STRICT").is_some_and(|v| v != "0");
    assert!(
        !strict,
        "this test cannot run here ({why}), and OMNIBUS_TEST_STRICT is set"
    );
    eprintln!("SKIPPED: {why} (OMNIBUS_TEST_STRICT=1 makes this a failure)");
}
