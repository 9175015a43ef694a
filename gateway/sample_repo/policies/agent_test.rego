package terraform.agent

import rego.v1

role(kind) := {"address": "aws_iam_role.r", "type": kind, "change": {"actions": ["create"]}}

test_an_agent_may_not_add_a_role if {
	count(deny) == 1 with input.resource_changes as [role("aws_iam_role")] with input.gateway as {"proposer_kind": "agent"}
}

test_a_person_may if {
	count(deny) == 0 with input.resource_changes as [role("aws_iam_role")] with input.gateway as {"proposer_kind": "person"}
}

test_an_agent_may_add_a_queue if {
	count(deny) == 0 with input.resource_changes as [role("aws_sqs_queue")] with input.gateway as {"proposer_kind": "agent"}
}
