# Every bucket says how sensitive its data is, with a level from policies/data/classification.json.
package terraform.s3

import rego.v1

warn contains finding if {
	some rc in input.resource_changes
	rc.type == "aws_s3_bucket"
	some action in rc.change.actions
	action in {"create", "update"}
	not classified(rc.change.after)
	finding := {
		"id": "s3-data-classification",
		"address": rc.address,
		"msg": concat("", ["tag the bucket with data-classification, one of: ", concat(", ", data.classification.levels)]),
	}
}

classified(after) if after.tags["data-classification"] in data.classification.levels
