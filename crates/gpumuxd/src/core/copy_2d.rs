//! Pitched copies (`Request::Copy2D`, `cudaMemcpy2DAsync`): `height` rows of
//! `width` bytes as one operation, not one request per row (issue 40). Each
//! side is a buffer or a host region, with its own pitch; the span of all
//! its rows is checked as one span, and the device moves the rows (a row
//! at a time, all queued at once, on the GPU and on the simulated device).

use super::*;
use crate::backend::{pitched_extent, Side2D};
use gpumux_proto::Place2D;

impl Core {
    /// Checks and submits a pitched copy; answered when done if `wait`
    /// (`None` here), else now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_2d(
        &mut self,
        client: u64,
        id: u64,
        src: Place2D,
        dst: Place2D,
        width: u64,
        height: u64,
        stream: StreamId,
        wait: bool,
    ) -> Option<Result<Reply, ErrorReply>> {
        let submitted = self.check_2d(client, src, dst, width, height).and_then(|(src, dst, direction, bytes)| {
            let work = OpWork::Copy2D { src, dst, width, height };
            self.submit_copy(client, stream, direction, bytes, work, wait.then_some(id))
        });
        match submitted {
            Ok(()) if wait => None,
            Ok(()) => Some(Ok(Reply::Done)),
            Err(e) => Some(Err(e)),
        }
    }

    /// Both sides resolved (their whole spans checked), the direction, and
    /// the bytes moved.
    fn check_2d(
        &self,
        client: u64,
        src: Place2D,
        dst: Place2D,
        width: u64,
        height: u64,
    ) -> Result<(Side2D, Side2D, CopyDirection, u64), ErrorReply> {
        let s = self.session(client)?;
        if width == 0 || height == 0 {
            return Err(err(
                ErrorKind::Invalid,
                format!("a 2-D copy of {height} rows of {width} bytes: nothing to copy"),
            ));
        }
        let bytes = width.checked_mul(height).ok_or_else(|| {
            err(ErrorKind::OutOfRange, format!("{height} rows of {width} bytes overflow a 64-bit size"))
        })?;
        let side = |place: Place2D, what: &str| -> Result<Side2D, ErrorReply> {
            let pitch = match place {
                Place2D::Device { pitch, .. } | Place2D::Host { pitch, .. } => pitch,
            };
            if width > pitch {
                return Err(err(
                    ErrorKind::Invalid,
                    format!("the {what}'s pitch of {pitch} bytes is less than a row of {width} bytes"),
                ));
            }
            let extent = pitched_extent(pitch, width, height).ok_or_else(|| {
                err(
                    ErrorKind::OutOfRange,
                    format!("the {what}'s {height} rows, {pitch} bytes apart, overflow a 64-bit offset"),
                )
            })?;
            Ok(match place {
                Place2D::Device { at, pitch } => Side2D::Device { addr: validate::device_span(s, at, extent)?, pitch },
                Place2D::Host { at, pitch } => {
                    let region = validate::host_span(s, at, extent)?;
                    Side2D::Host { span: HostSpan { region, offset: at.offset }, pitch }
                }
            })
        };
        let (src, dst) = (side(src, "source")?, side(dst, "destination")?);
        let direction = match (&src, &dst) {
            (Side2D::Host { .. }, Side2D::Host { .. }) => {
                return Err(err(ErrorKind::Invalid, "a 2-D copy from host memory to host memory: copy on the host"))
            }
            (Side2D::Host { .. }, Side2D::Device { .. }) => CopyDirection::HostToDevice,
            (Side2D::Device { .. }, Side2D::Host { .. }) => CopyDirection::DeviceToHost,
            (Side2D::Device { .. }, Side2D::Device { .. }) => CopyDirection::DeviceToDevice,
        };
        Ok((src, dst, direction, bytes))
    }
}
