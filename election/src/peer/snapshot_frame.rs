//! The snapshot RPC's body: a length-prefixed JSON header, then the snapshot
//! data as it is.

use openraft::alias::VoteOf;

use crate::raft::TypeConfig;

/// The largest snapshot a node accepts from a peer: 1 GiB (about ten
/// million leases in [`crate::raft::snapshot_codec`]'s encoding).
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 30;

/// The snapshot RPC's body: `u32` (little-endian) length of a JSON
/// `[vote, meta]`, that JSON, then the snapshot data as it is — no JSON
/// array of numbers around a blob that may be hundreds of megabytes.
pub(super) fn snapshot_frame(
    vote: &VoteOf<TypeConfig>,
    meta: &openraft::alias::SnapshotMetaOf<TypeConfig>,
    data: &[u8],
) -> Result<Vec<u8>, std::io::Error> {
    let header = serde_json::to_vec(&(vote, meta))?;
    let len = u32::try_from(header.len()).map_err(std::io::Error::other)?;
    let mut frame = Vec::with_capacity(4 + header.len() + data.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&header);
    frame.extend_from_slice(data);
    Ok(frame)
}

/// A snapshot RPC's parts: the sender's vote, the snapshot's meta, its data.
pub(super) type SnapshotParts = (
    VoteOf<TypeConfig>,
    openraft::alias::SnapshotMetaOf<TypeConfig>,
    Vec<u8>,
);

/// Splits a [`snapshot_frame`] into vote, meta and data.
pub(super) fn parse_snapshot_frame(mut frame: Vec<u8>) -> Result<SnapshotParts, String> {
    let len = frame
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
        .ok_or("snapshot frame: truncated")? as usize;
    let header = frame
        .get(4..4 + len)
        .ok_or("snapshot frame: truncated header")?;
    let (vote, meta) =
        serde_json::from_slice(header).map_err(|e| format!("snapshot frame: {e}"))?;
    let data = frame.split_off(4 + len);
    Ok((vote, meta, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_splits_into_what_was_framed() {
        let vote = VoteOf::<TypeConfig>::new(3, 1);
        let meta = openraft::alias::SnapshotMetaOf::<TypeConfig>::default();
        let data = vec![0u8, 1, 2, 255];
        let frame = snapshot_frame(&vote, &meta, &data).expect("frame");
        let (got_vote, got_meta, got_data) = parse_snapshot_frame(frame).expect("parse");
        assert_eq!((got_vote, got_meta, got_data), (vote, meta, data));
    }

    #[test]
    fn a_truncated_frame_is_an_error_not_a_panic() {
        let vote = VoteOf::<TypeConfig>::new(3, 1);
        let meta = openraft::alias::SnapshotMetaOf::<TypeConfig>::default();
        let frame = snapshot_frame(&vote, &meta, b"data").expect("frame");
        for cut in [0, 2, 4, 10] {
            assert!(
                parse_snapshot_frame(frame[..cut].to_vec()).is_err(),
                "cut at {cut}"
            );
        }
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        assert!(parse_snapshot_frame(huge).is_err());
    }
}
