"""The cloudformation engine: CloudFormation stacks planned as change sets, applied by executing exactly that one."""
