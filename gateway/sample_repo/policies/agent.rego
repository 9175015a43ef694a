# Identity and access stay with people: an agent may not propose IAM changes, whoever asked for them.
package terraform.agent

import rego.v1

deny contains finding if {
	input.gateway.proposer_kind == "agent"
	some rc in input.resource_changes
	startswith(rc.type, "aws_iam_")
	rc.change.actions != ["no-op"]
	finding := {
		"id": "agent-iam",
		"address": rc.address,
		"msg": "an agent may not change IAM resources; a person must propose this change",
	}
}
