//! What the GPU tests of a client device share: the name a skipped test
//! gives in its line, and host memory pinned for their copies.

/// The name of the test function this stands in, for its skip line
/// ("SKIPPED <test>: why"; written out by hand, it could drift from the
/// test's name).
macro_rules! test_name {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        path.strip_suffix("::here").and_then(|p| p.rsplit("::").next()).unwrap_or(path)
    }};
}
pub(crate) use test_name;

use gpumux_cuda::client::{ClientDevice, HostPtr};

/// Host memory registered with the device for the test's copies.
pub struct Pinned(pub Vec<u8>);

impl Pinned {
    pub fn new(d: &mut ClientDevice, bytes: Vec<u8>) -> Pinned {
        let mut p = Pinned(bytes);
        // SAFETY: the vector is neither moved nor resized while registered (the test unregisters it).
        unsafe { d.register_host(p.0.as_mut_ptr(), p.0.len()) }.expect("register host");
        p
    }

    pub fn ptr(&mut self) -> HostPtr {
        HostPtr(self.0.as_mut_ptr())
    }
}
