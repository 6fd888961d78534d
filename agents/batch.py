"""Offline batch jobs: one job event becomes individual requests carrying the job's deadline."""

from __future__ import annotations

from schemas.events import BatchJob, InferenceRequest


def expand_batch_job(job: BatchJob) -> list[InferenceRequest]:
    """Each request of ``job`` as a ``batch``-class request due at ``job.ts + job.deadline_s``.

    Request ids are prefixed with the job id (unless they already are) so two jobs may reuse ids.
    """
    deadline = job.ts + job.deadline_s
    prefix = f"{job.job_id}/"
    return [
        request.model_copy(
            update={
                "request_id": request.request_id
                if request.request_id.startswith(prefix)
                else prefix + request.request_id,
                "tenant": job.tenant,
                "slo_class": "batch",
                "deadline_ts": deadline,
            }
        )
        for request in job.requests
    ]
