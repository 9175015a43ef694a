"""GitHub deliveries and pull requests."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError

from gateway.adapters.store.rows import (
    Records,
    aware,
    now,
)
from gateway.adapters.store.schema import (
    audit_events,
    proposals,
    pull_requests,
    webhook_deliveries,
)
from gateway.domain.github import Delivery, PullRequestLink
from gateway.domain.proposal import ProposalKind, ProposalStatus


class SqlGitHubRecords(Records):
    """Webhook deliveries and the pull request of each proposal."""

    def add_delivery(self, delivery_id: str, event: str, action: str | None, payload: str) -> bool:
        """Record a webhook delivery once; False when this delivery id was recorded before (a redelivery)."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(
                    insert(webhook_deliveries).values(
                        delivery_id=delivery_id, event=event, action=action, payload=payload, received_at=now()
                    )
                )
        except IntegrityError:
            return False
        return True

    def set_delivery_job(self, delivery_id: str, job_id: int) -> None:
        self.conn.execute(
            update(webhook_deliveries).where(webhook_deliveries.c.delivery_id == delivery_id).values(job_id=job_id)
        )

    def delivery(self, delivery_id: str) -> Delivery | None:
        row = (
            self.conn.execute(select(webhook_deliveries).where(webhook_deliveries.c.delivery_id == delivery_id))
            .mappings()
            .first()
        )
        return Delivery(row["delivery_id"], row["event"], row["action"], row["payload"], row["job_id"],
                        aware(row["received_at"])) if row else None

    def link_pull_request(self, proposal_id: int, repository: str, number: int) -> None:
        """Record the proposal's pull request (once: a second link of the same proposal changes nothing)."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(
                    insert(pull_requests).values(
                        proposal_id=proposal_id, repository=repository, number=number, published_seq=0, created_at=now()
                    )
                )
        except IntegrityError:
            pass

    def pull_request_of(self, proposal_id: int) -> PullRequestLink | None:
        row = (
            self.conn.execute(select(pull_requests).where(pull_requests.c.proposal_id == proposal_id))
            .mappings()
            .first()
        )
        if row is None:
            return None
        attempted = row["attempted_at"]
        return PullRequestLink(row["proposal_id"], row["repository"], row["number"], row["comment_id"],
                               row["published_seq"], row["published_digest"], row["publish_error"],
                               aware(attempted) if attempted else None)

    def proposal_for_pull_request(self, repository: str, number: int) -> int | None:
        """The newest proposal of this pull request (a reopened one gets a new proposal)."""
        return self.conn.scalar(
            select(pull_requests.c.proposal_id)
            .where(pull_requests.c.repository == repository, pull_requests.c.number == number)
            .order_by(pull_requests.c.proposal_id.desc())
            .limit(1)
        )

    def mark_published(
        self, proposal_id: int, seq: int, comment_id: int | None, error: str | None = None, digest: str | None = None
    ) -> None:
        values: dict[str, Any] = {"publish_error": self.scrubber.scrub(error) if error else None, "attempted_at": now()}
        if error is None:
            values["published_seq"] = seq
            values["published_digest"] = digest
        if comment_id is not None:
            values["comment_id"] = comment_id
        self.conn.execute(update(pull_requests).where(pull_requests.c.proposal_id == proposal_id).values(**values))

    def unpublished_proposals(self, open_statuses: Collection[ProposalStatus], retry_after_seconds: float) -> list[int]:
        """Proposals whose pull request shows less than their trail: newer events, or no pull request yet (open ones).

        One whose last publish failed waits `retry_after_seconds` before it is tried again.
        """
        newest = (
            select(audit_events.c.proposal_id, func.max(audit_events.c.seq).label("seq"))
            .where(audit_events.c.proposal_id.is_not(None))
            .group_by(audit_events.c.proposal_id)
            .subquery()
        )
        behind = (
            select(pull_requests.c.proposal_id)
            .join(newest, newest.c.proposal_id == pull_requests.c.proposal_id)
            .join(proposals, proposals.c.id == pull_requests.c.proposal_id)
            .where(
                proposals.c.repository == self.repository,  # another repository's are published from there
                newest.c.seq > pull_requests.c.published_seq,
                pull_requests.c.publish_error.is_(None)
                | (pull_requests.c.attempted_at < now() - timedelta(seconds=retry_after_seconds)),
            )
        )
        unlinked = select(proposals.c.id).where(  # a revert of drift has nothing to review in a pull request
            proposals.c.repository == self.repository,
            proposals.c.status.in_([s.value for s in open_statuses]),
            proposals.c.kind.is_(None) | (proposals.c.kind != ProposalKind.DRIFT_REVERT.value),
            proposals.c.id.not_in(select(pull_requests.c.proposal_id)),
        )
        return sorted(set(self.conn.scalars(behind)) | set(self.conn.scalars(unlinked)))
