//! [`FencingAudit`] in PostgreSQL, shared: per lease, how many writes were
//! refused for a stale token and the last one, whichever gateway refused
//! them. Bounded: past [`AUDITED_LEASES`] leases the ones refused longest
//! ago are forgotten.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::PostgresStore;
use crate::audit::{AuditAnswer, FencingAudit, LeaseRefusals, Refusal, AUDITED_LEASES};
use crate::error::StoreError;

const RECORD: &str = "
INSERT INTO palisade_gateway.refusals AS r
    (lease, count, token, fence, holder, key, peer, at_unix_ms)
VALUES ($1, 1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (lease) DO UPDATE SET count = r.count + 1, token = EXCLUDED.token,
    fence = EXCLUDED.fence, holder = EXCLUDED.holder, key = EXCLUDED.key,
    peer = EXCLUDED.peer, at_unix_ms = EXCLUDED.at_unix_ms
RETURNING (xmax = 0) AS inserted";

const PRUNE: &str = "
DELETE FROM palisade_gateway.refusals WHERE lease IN (
    SELECT lease FROM palisade_gateway.refusals ORDER BY at_unix_ms DESC OFFSET $1)";

const COLUMNS: &str = "lease, count, token, fence, holder, key, peer, at_unix_ms";

impl FencingAudit for PostgresStore {
    fn record<'a>(&'a self, lease: &'a str, refusal: &'a Refusal) -> AuditAnswer<'a, ()> {
        Box::pin(self.record_refusal(lease, refusal))
    }

    fn refusals<'a>(&'a self, lease: &'a str) -> AuditAnswer<'a, Option<LeaseRefusals>> {
        Box::pin(self.refusals_of(lease))
    }

    fn recent(&self, limit: usize) -> AuditAnswer<'_, Vec<LeaseRefusals>> {
        Box::pin(self.recent_refusals(limit))
    }
}

impl PostgresStore {
    /// Counts a refused write of `lease` and keeps it as the lease's last.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database fails.
    async fn record_refusal(&self, lease: &str, refusal: &Refusal) -> Result<(), StoreError> {
        // PostgreSQL's text cannot hold NUL; a JWT's subject is not checked here.
        let holder = refusal.holder.replace('\0', "\u{fffd}");
        let (token, fence, at) = (
            refusal.token as i64,
            refusal.fence as i64,
            refusal.at_unix_ms as i64,
        );
        let params: [&(dyn ToSql + Sync); 7] = [
            &lease,
            &token,
            &fence,
            &holder,
            &refusal.key,
            &refusal.peer,
            &at,
        ];
        let rows = self.query(RECORD, &params).await?;
        if rows.first().is_some_and(|row| row.get::<_, bool>(0)) {
            self.query(PRUNE, &[&(AUDITED_LEASES as i64)]).await?;
        }
        Ok(())
    }

    /// `lease`'s refused writes, if any were kept.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database fails.
    async fn refusals_of(&self, lease: &str) -> Result<Option<LeaseRefusals>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM palisade_gateway.refusals WHERE lease = $1");
        let rows = self.query(&sql, &[&lease]).await?;
        Ok(rows.first().map(lease_refusals))
    }

    /// The leases with refused writes, the most recently refused first, at
    /// most `limit`.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database fails.
    async fn recent_refusals(&self, limit: usize) -> Result<Vec<LeaseRefusals>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM palisade_gateway.refusals ORDER BY at_unix_ms DESC LIMIT $1"
        );
        let limit = limit.min(AUDITED_LEASES) as i64;
        let rows = self.query(&sql, &[&limit]).await?;
        Ok(rows.iter().map(lease_refusals).collect())
    }
}

fn lease_refusals(row: &Row) -> LeaseRefusals {
    LeaseRefusals {
        lease: row.get(0),
        count: row.get::<_, i64>(1) as u64,
        last: Refusal {
            token: row.get::<_, i64>(2) as u64,
            fence: row.get::<_, i64>(3) as u64,
            holder: row.get(4),
            key: row.get(5),
            peer: row.get(6),
            at_unix_ms: row.get::<_, i64>(7) as u64,
        },
    }
}
