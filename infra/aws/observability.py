"""Dashboard and alarms. Metrics come from Powertools (namespace "jobplane", dimension service=jobplane)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.aws.nag import acknowledge
from jobplane.decide import rules

NAMESPACE = "jobplane"
PERIOD = cdk.Duration.minutes(5)

# Dashboard rows: title -> metric names (telemetry names from the shared contract). A reconciler rule's metric is
# graphed on the panel its facts name (jobplane.decide.rules), after the metrics listed here.
_OTHER_METRICS = {
    "Jobs by outcome state": ["JobsLaunched", "JobsSucceeded", "JobsFailed", "JobsRejected"],
    "Launches and capacity": ["JobsLaunched", "LaunchCapacityErrors"],
    rules.RERUNS: [],
    rules.ENDS: [],
    rules.SAFETY: ["BlastRadiusRefusals", "ActionErrors"],
    "Cloud API calls": ["ApiCalls"],
    rules.IDLE_GPUS: ["NotificationsPublished", "NotificationsFailed"],
    rules.SWEEPS: ["SweepTrialsProposed", "SweepErrors"],
}
_RULE_METRICS = rules.panels()
PANELS = {title: [*_OTHER_METRICS.get(title, []), *_RULE_METRICS.get(title, [])]
          for title in [*_OTHER_METRICS, *(t for t in _RULE_METRICS if t not in _OTHER_METRICS)]}


def jobplane_metric(name: str, statistic: str = "Sum") -> cw.Metric:
    return cw.Metric(namespace=NAMESPACE, metric_name=name, dimensions_map={"service": "jobplane"},
                     statistic=statistic, period=PERIOD)


class Observability(Construct):
    def __init__(self, scope: Construct, construct_id: str, functions: dict[str, lambda_.Function],
                 dead_letters: sqs.Queue, alarm_email: str | None, dashboard: bool = False) -> None:
        super().__init__(scope, construct_id)
        self.topic = sns.Topic(self, "AlarmTopic", display_name="jobplane alarms", enforce_ssl=True)
        acknowledge(self.topic, "AwsSolutions-SNS2",
                    "CloudWatch alarms cannot publish to a topic encrypted with the AWS-managed SNS key, and a "
                    "customer-managed key costs $1/month idle; alarm messages carry no job data.")
        if alarm_email:
            self.topic.add_subscription(subs.EmailSubscription(alarm_email))

        self.alarms: list[cw.Alarm] = []
        for name, fn in functions.items():
            self._alarm(f"{name.title().replace('_', '')}Errors", fn.metric_errors(period=PERIOD, statistic="Sum"),
                        f"jobplane {name} raised an error")
        self._alarm("DeadLetters", dead_letters.metric_approximate_number_of_messages_visible(
            period=PERIOD, statistic="Maximum"), "events or invocations were dropped into the DLQ")
        self._alarm("BlastRadius", jobplane_metric("BlastRadiusRefusals"),
                    "a reconciler refused a mass termination (blast-radius limit)")

        self.dashboard = self._dashboard(functions) if dashboard else None

    def _dashboard(self, functions: dict[str, lambda_.Function]) -> cw.Dashboard:
        """Opt-in (jobplane:dashboard): $3 a month, three times the rest of an idle deployment."""
        dashboard = cw.Dashboard(self, "Dashboard", default_interval=cdk.Duration.days(1))
        widgets: list[cw.IWidget] = [
            cw.GraphWidget(title=title, left=[jobplane_metric(m) for m in names], width=8)
            for title, names in PANELS.items()
        ]
        widgets.append(cw.GraphWidget(title="Check duration (ms)", width=8,
                                      left=[jobplane_metric("CheckDuration", "Average"),
                                            jobplane_metric("CheckDuration", "Maximum")]))
        widgets.append(cw.GraphWidget(title="Function errors", width=8,
                                      left=[fn.metric_errors(period=PERIOD) for fn in functions.values()]))
        widgets.append(cw.GraphWidget(title="Function duration (ms)", width=8,
                                      left=[fn.metric_duration(period=PERIOD) for fn in functions.values()]))
        widgets.append(cw.AlarmStatusWidget(title="Alarms", alarms=self.alarms, width=24))
        dashboard.add_widgets(*widgets)
        return dashboard

    def _alarm(self, alarm_id: str, metric: cw.IMetric, description: str) -> None:
        alarm = cw.Alarm(self, f"{alarm_id}Alarm", metric=metric, threshold=1, evaluation_periods=1,
                         comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                         treat_missing_data=cw.TreatMissingData.NOT_BREACHING, alarm_description=description)
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.alarms.append(alarm)
