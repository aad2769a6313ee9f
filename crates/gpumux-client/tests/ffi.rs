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
    assert_eq!((a.kind, a.i), (gpumux_arg_kind::GPUMUX_ARG_I32 as i32, -3));
    let f = gpumux_arg_f32(1.5);
    assert_eq!((f.kind, f.f), (gpumux_arg_kind::GPUMUX_ARG_F32 as i32, 1.5));
    let b = gpumux_arg_buffer(Buffer::default(), 64);
    assert_eq!((b.kind, b.offset), (gpumux_arg_kind::GPUMUX_ARG_BUFFER as i32, 64));
    for v in [-1, 8, 99, i32::MIN, i32::MAX] {
        assert_eq!(gpumux_arg_kind::from_raw(v), None, "{v}");
    }
    assert_eq!(gpumux_arg_kind::from_raw(7), Some(gpumux_arg_kind::GPUMUX_ARG_BYTES));
}

/// Issue 36, case 7: pointers the library never gave out, or took back, are
/// refused from a table of live handles, never dereferenced. On 717b546
/// each of these read or freed memory through the pointer (a double
/// disconnect was a double free).
#[test]
fn pointers_that_are_no_live_handle_are_refused_without_being_touched() {
    let invalid = gpumux_status::GPUMUX_ERR_INVALID_ARGUMENT;
    // Addresses that would crash if read: not mapped, or misaligned.
    let forged = [8usize, 0x10, usize::MAX & !7, 0x000d_eadb_eef0];
    for &p in &forged {
        let c = p as *mut gpumux_client;
        assert_eq!(unsafe { gpumux_sync(c, 0) }, invalid, "{p:#x}");
        assert!(last_error().contains("is not one gpumux_connect returned"), "{}", last_error());
        assert_eq!(unsafe { gpumux_disconnect(c) }, invalid);
        assert!(unsafe { gpumux_device(c) }.is_null());
        assert!(unsafe { gpumux_policy(c) }.is_null());
        assert!(!unsafe { gpumux_is_simulated(c) });
        let mut host = null_mut();
        assert_eq!(unsafe { gpumux_host_alloc(c, 16, &mut host) }, invalid);
        assert_eq!(unsafe { gpumux_module_free(p as *mut gpumux_module) }, invalid);
        let mut kernel = null();
        let name = CString::new("k").unwrap();
        assert_eq!(unsafe { gpumux_module_kernel(p as *const gpumux_module, name.as_ptr(), &mut kernel) }, invalid);
        assert!(last_error().contains("is not one gpumux_load_module returned"), "{}", last_error());
    }
    assert_eq!(unsafe { gpumux_module_free(null_mut()) }, gpumux_status::GPUMUX_OK, "freeing NULL is a no-op");

    // A live client: a forged kernel, a disconnect twice.
    let fake = FakeDaemon::start(Behaviour::default());
    let socket = CString::new(fake.socket.to_str().unwrap()).unwrap();
    let mut client = null_mut();
    assert_eq!(unsafe { gpumux_connect(socket.as_ptr(), null(), 0, 1.0, 0, &mut client) }, gpumux_status::GPUMUX_OK);
    let cfg = gpumux_launch_config { grid: [1; 3], block: [1; 3], shared_bytes: 0, stream: 0, block_time_ns: 0 };
    let kernel = Box::new(0u64);
    let forged_kernel = &*kernel as *const u64 as *const ::gpumux_client::Kernel;
    assert_eq!(unsafe { gpumux_launch(client, forged_kernel, &cfg, null(), 0) }, invalid);
    assert!(last_error().contains("is not one gpumux_module_kernel returned"), "{}", last_error());
    assert_eq!(unsafe { gpumux_disconnect(client) }, gpumux_status::GPUMUX_OK);
    assert_eq!(unsafe { gpumux_disconnect(client) }, invalid, "a second disconnect is refused, not a double free");
    assert_eq!(unsafe { gpumux_sync(client, 0) }, invalid, "a disconnected client is refused, not used after free");
    fake.finish();
}

/// Issue 36, case 7: lengths are bounded and out-pointers aligned before a
/// slice or a reference is made of them (on 717b546 each was undefined
/// behaviour: a slice longer than the address space, a misaligned write).
#[test]
fn lengths_and_alignment_are_checked_before_use() {
    let invalid = gpumux_status::GPUMUX_ERR_INVALID_ARGUMENT;
    let fake = FakeDaemon::start(Behaviour::default());
    let socket = CString::new(fake.socket.to_str().unwrap()).unwrap();
    let mut client = null_mut();
    assert_eq!(unsafe { gpumux_connect(socket.as_ptr(), null(), 0, 1.0, 0, &mut client) }, gpumux_status::GPUMUX_OK);
    let mut buf = Buffer::default();
    assert_eq!(unsafe { gpumux_alloc(client, 16, &mut buf) }, gpumux_status::GPUMUX_OK);
    let data = [0u8; 16];
    for bytes in [usize::MAX, isize::MAX as usize + 1] {
        assert_eq!(unsafe { gpumux_copy_to_device(client, buf, 0, data.as_ptr().cast(), bytes, 0) }, invalid);
        assert!(last_error().contains("runs past the end of the address space"), "{}", last_error());
        let mut out = [0u8; 16];
        assert_eq!(unsafe { gpumux_copy_to_host(client, buf, 0, out.as_mut_ptr().cast(), bytes, 0) }, invalid);
    }
    // A misaligned out-pointer.
    let mut words = [0u64; 4];
    let misaligned = unsafe { words.as_mut_ptr().cast::<u8>().add(1) }.cast::<Buffer>();
    assert_eq!(unsafe { gpumux_alloc(client, 16, misaligned) }, invalid);
    assert!(last_error().contains("is not aligned"), "{}", last_error());
    let mut stream = 0u32;
    let misaligned_u32 = unsafe { (&mut stream as *mut u32).cast::<u8>().add(1) }.cast::<u32>();
    assert_eq!(unsafe { gpumux_create_stream(client, misaligned_u32) }, invalid);
    // Too many options: refused before the array is read.
    let name = CString::new("m.cu").unwrap();
    let source = CString::new("__global__ void k() {}").unwrap();
    let mut module = null_mut();
    let options = [null::<std::ffi::c_char>(); 1];
    let status =
        unsafe { gpumux_load_module(client, name.as_ptr(), source.as_ptr(), options.as_ptr(), 65, &mut module) };
    assert_eq!(status, invalid);
    assert!(last_error().contains("n_options is 65, over the limit of 64"), "{}", last_error());
    assert_eq!(unsafe { gpumux_disconnect(client) }, gpumux_status::GPUMUX_OK);
    fake.finish();
}
