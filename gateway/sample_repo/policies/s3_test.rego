package terraform.s3

import rego.v1

bucket(tags) := {"address": "aws_s3_bucket.b", "type": "aws_s3_bucket", "change": {"actions": ["create"], "after": {"tags": tags}}}

test_an_unclassified_bucket_warns if {
	count(warn) == 1 with input.resource_changes as [bucket({"owner": "data"})]
}

test_a_classified_bucket_passes if {
	count(warn) == 0 with input.resource_changes as [bucket({"data-classification": "internal"})]
}

test_an_unknown_level_warns if {
	count(warn) == 1 with input.resource_changes as [bucket({"data-classification": "secret-ish"})]
}
