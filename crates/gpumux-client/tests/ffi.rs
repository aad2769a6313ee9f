//! The C ABI's null and error paths, and one round trip through a fake daemon.

mod support;

use ::gpumux_client::ffi::*;
use ::gpumux_client::Buffer;
use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};
use support::{Behaviour, FakeDaemon};

fn last_error() -> String {
    unsafe { CStr::from_ptr(gpumux_last_error()) }.to_str().unwrap().to_owned()
}

#[test]
fn null_pointers_are_refused_with_a_message() {
    let mut buffer = std::mem::MaybeUninit::<Buffer>::uninit();
    let status = unsafe { gpumux_alloc(null(), 16, buffer.as_mut_ptr()) };
    assert_eq!(status, gpumux_status::GPUMUX_ERR_NULL);
    assert_eq!(last_error(), "the client is NULL");
    assert_eq!(unsafe { gpumux_sync(null(), 0) }, gpumux_status::GPUMUX_ERR_NULL);
    assert_eq!(unsafe { gpumux_connect(null(), null(), 0, 1.0, 0, null_mut()) }, gpumux_status::GPUMUX_ERR_NULL);
    assert_eq!(last_error(), "out_client is NULL");
    let mut kernel = null();
    let name = CString::new("k").unwrap();
    assert_eq!(unsafe { gpumux_module_kernel(null(), name.as_ptr(), &mut kernel) }, gpumux_status::GPUMUX_ERR_NULL);
    assert_eq!(unsafe { gpumux_disconnect(null_mut()) }, gpumux_status::GPUMUX_OK, "disconnecting NULL is a no-op");
    let mut host = null_mut();
    assert_eq!(unsafe { gpumux_host_alloc(null(), 16, &mut host) }, gpumux_status::GPUMUX_ERR_NULL);
    assert_eq!(last_error(), "the client is NULL");
    assert!(host.is_null());
    assert_eq!(unsafe { gpumux_host_free(null(), null_mut()) }, gpumux_status::GPUMUX_ERR_NULL);
    assert!(unsafe { gpumux_device(null()) }.is_null());
}

#[test]
fn a_missing_daemon_is_a_connect_error() {
    let socket = CString::new("/nonexistent/gpumux.sock").unwrap();
    let mut client = null_mut();
    let status = unsafe { gpumux_connect(socket.as_ptr(), null(), 0, 1.0, 0, &mut client) };
    assert_eq!(status, gpumux_status::GPUMUX_ERR_CONNECT);
    assert!(client.is_null());
    assert!(last_error().starts_with("no daemon listens on /nonexistent/gpumux.sock"), "{}", last_error());
}

#[test]
fn copies_round_trip_through_the_c_abi() {
    let fake = FakeDaemon::start(Behaviour::default());
    let socket = CString::new(fake.socket.to_str().unwrap()).unwrap();
    let name = CString::new("c-test").unwrap();
    let mut client = null_mut();
    assert_eq!(
        unsafe { gpumux_connect(socket.as_ptr(), name.as_ptr(), 0, 1.0, 0, &mut client) },
        gpumux_status::GPUMUX_OK
    );
    assert!(unsafe { gpumux_is_simulated(client) });
    assert_eq!(unsafe { CStr::from_ptr(gpumux_device(client)) }.to_str().unwrap(), "sim:h100");
    let mut buf = Buffer::default();
    assert_eq!(unsafe { gpumux_alloc(client, 5000, &mut buf) }, gpumux_status::GPUMUX_OK);
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        unsafe { gpumux_copy_to_device(client, buf, 0, data.as_ptr().cast(), data.len(), 0) },
        gpumux_status::GPUMUX_OK
    );
    let mut back = vec![0u8; 5000];
    assert_eq!(
        unsafe { gpumux_copy_to_host(client, buf, 0, back.as_mut_ptr().cast(), back.len(), 0) },
        gpumux_status::GPUMUX_OK
    );
    assert!(back == data);
    let status = unsafe { gpumux_copy_to_host(client, buf, 1, back.as_mut_ptr().cast(), back.len(), 0) };
    assert_eq!(status, gpumux_status::GPUMUX_ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "copy to the host of 5000 bytes at offset 1 runs past the end of a buffer of 5000 bytes");
    let mut zero = Buffer::default();
    assert_eq!(unsafe { gpumux_alloc(client, 0, &mut zero) }, gpumux_status::GPUMUX_ERR_INVALID);
    assert_eq!(unsafe { gpumux_disconnect(client) }, gpumux_status::GPUMUX_OK);
    assert!(fake.finish().requests.iter().any(|r| matches!(r, gpumux_proto::Request::Goodbye)));
}

#[test]
fn arg_constructors_tag_their_values() {
    let a = gpumux_arg_i32(-3);
    assert_eq!((a.kind, a.i), (gpumux_arg_kind::GPUMUX_ARG_I32, -3));
    let f = gpumux_arg_f32(1.5);
    assert_eq!((f.kind, f.f), (gpumux_arg_kind::GPUMUX_ARG_F32, 1.5));
    let b = gpumux_arg_buffer(Buffer::default(), 64);
    assert_eq!((b.kind, b.offset), (gpumux_arg_kind::GPUMUX_ARG_BUFFER, 64));
}
