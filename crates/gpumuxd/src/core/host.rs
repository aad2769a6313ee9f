//! Host regions: memory of a client's own (the client library's
//! `alloc_host`) that the daemon maps and pins, so that copies move data
//! between it and device memory directly, with no staging copy on either
//! side (the equivalent of `cudaHostAlloc` memory; issue 35).
//!
//! A region is checked as the shared region is (a memfd sealed against
//! shrinking, at least as long as claimed: `ShmRegion::map`), counted
//! against the client's `host_memory` limit and [`MAX_HOST_REGIONS`], and
//! registered with the device. Detaching it takes its handle away at once;
//! it is unregistered and unmapped once the work queued before the detach
//! is done (`Release::Host`), as a freed buffer is freed.

use super::*;
use gpumux_proto::{HostRegionId, MAX_HOST_REGIONS};

impl Core {
    /// `AttachHost`: maps, checks and pins the memfd that came with it.
    /// Answered once it is pinned ([`Core::region_pinned`]); its bytes count
    /// against the limit from now, so pins under way cannot pass it together.
    pub(super) fn attach_host(
        &mut self,
        client: u64,
        id: u64,
        bytes: u64,
        fd: Option<OwnedFd>,
    ) -> Result<(), ErrorReply> {
        let s = self.session(client)?;
        let fd =
            fd.ok_or_else(|| err(ErrorKind::Invalid, "AttachHost came without a memfd (send it with SCM_RIGHTS)"))?;
        if bytes == 0 {
            return Err(err(ErrorKind::Invalid, "a host region of 0 bytes"));
        }
        if s.host_regions.len() >= MAX_HOST_REGIONS {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "{} host regions attached, the limit is {MAX_HOST_REGIONS}: free some first",
                    s.host_regions.len()
                ),
            ));
        }
        let limit = s.limits.host_memory;
        if s.host_used.checked_add(bytes).is_none_or(|total| total > limit) {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "a host region of {bytes} bytes would bring your pinned host memory to {} bytes, over your \
                     host_memory limit of {limit} bytes (you hold {} bytes)",
                    s.host_used as u128 + bytes as u128,
                    s.host_used
                ),
            ));
        }
        let region = Arc::new(ShmRegion::map(fd, bytes).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?);
        self.start_pin(client, id, region, PinFor::Host { bytes })?;
        self.session_mut(client)?.host_used += bytes;
        Ok(())
    }

    /// A pinned host region joins `client`'s session (its bytes were counted
    /// when the pin started): its handle.
    pub(super) fn add_host_region(&mut self, client: u64, region: Arc<ShmRegion>) -> Result<Reply, ErrorReply> {
        match self.session_mut(client) {
            Ok(s) => {
                let id = HostRegionId(s.next_handle());
                s.host_regions.insert(id, region);
                Ok(Reply::HostRegion(id))
            }
            Err(e) => {
                self.backend.unregister_host(&region);
                Err(e)
            }
        }
    }

    /// `DetachHost`: the handle goes now, the pinning once the client's
    /// operations queued before it are done.
    pub(super) fn detach_host(&mut self, client: u64, h: HostRegionId) -> Result<Reply, ErrorReply> {
        let waiting_for = self.client_ops(client);
        let s = self.session_mut(client)?;
        let region = s.host_regions.remove(&h).ok_or_else(|| {
            err(ErrorKind::NoSuchHandle, format!("host region {} is not yours (or was detached)", h.0))
        })?;
        s.host_used -= region.len() as u64;
        self.defer(waiting_for, Release::Host(region));
        Ok(Reply::Done)
    }

    /// `CopyFromHostRegion` or `CopyToHostRegion` (`copy`), or their `Async`
    /// forms: checked and submitted; answered when the copy is done (`None`
    /// here; the async forms never, as an accepted launch), or refused now.
    /// A client that does not wait keeps the device's copy queue full: the
    /// next copy of its stream is on its way while this one moves, not a
    /// reply and a request later (issue 40's pipeline).
    pub(super) fn host_copy(&mut self, client: u64, id: u64, copy: Request) -> Option<Result<Reply, ErrorReply>> {
        let (device, host, bytes, stream, to_device, wait) = match copy {
            Request::CopyFromHostRegion { dst, src, bytes, stream } => (dst, src, bytes, stream, true, true),
            Request::CopyToHostRegion { src, dst, bytes, stream } => (src, dst, bytes, stream, false, true),
            Request::CopyFromHostRegionAsync { dst, src, bytes, stream } => (dst, src, bytes, stream, true, false),
            Request::CopyToHostRegionAsync { src, dst, bytes, stream } => (src, dst, bytes, stream, false, false),
            other => return Some(Err(err(ErrorKind::Protocol, format!("{} is not a host region copy", other.name())))),
        };
        let checked = self
            .session(client)
            .and_then(|s| Ok((validate::device_span(s, device, bytes)?, validate::host_span(s, host, bytes)?)));
        let submitted = checked.and_then(|(addr, region)| {
            let span = HostSpan { region, offset: host.offset };
            let (direction, work) = if to_device {
                (CopyDirection::HostToDevice, OpWork::ToDevice { dst: addr, src: span, bytes })
            } else {
                (CopyDirection::DeviceToHost, OpWork::ToHost { src: addr, dst: span, bytes })
            };
            self.submit_copy(client, stream, direction, bytes, work, wait.then_some(id))
        });
        if submitted.is_ok() && wait {
            // The client's next request comes right after this one's reply.
            if let Some(s) = self.sessions.get(&client) {
                s.spin.hold_for(copy_time(bytes));
            }
        }
        submitted.err().map(Err)
    }

    /// Host memory pinned for clients' host regions: attached ones (gone
    /// clients' included) and detached ones waiting for their operations.
    pub fn host_memory_held(&self) -> u64 {
        let attached: u64 = self.sessions.values().flat_map(|s| s.host_regions.values()).map(|r| r.len() as u64).sum();
        let detached: u64 = self
            .deferred
            .iter()
            .filter_map(|d| match &d.release {
                Release::Host(r) => Some(r.len() as u64),
                _ => None,
            })
            .sum();
        attached + detached
    }
}

/// How long a client waiting for a host copy of `bytes` keeps its
/// connection's reader polling (`ConnSpin::hold_for`): the copy's expected
/// time, as the client estimates it, plus the reader's own window.
fn copy_time(bytes: u64) -> std::time::Duration {
    gpumux_proto::expected_copy_time(bytes).saturating_add(std::time::Duration::from_micros(100))
}
