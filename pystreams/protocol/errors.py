"""Errors the KIP-848 text defines but Apache Kafka never shipped.

INVALID_ASSIGNMENT (ConsumerGroupInstallAssignment) has no Kafka error code because Kafka
dropped client-side assignment from its implementation; pystreams gives it code 1000, beside
the API keys it picked for Prepare/Install, far from Kafka's range. Registered with
kafka-python so ``kafka.errors.for_code`` knows it.
"""

from kafka import errors as _kafka_errors


class InvalidAssignmentError(_kafka_errors.BrokerResponseError):
    errno = 1000
    message = "INVALID_ASSIGNMENT"
    description = "The installed assignment does not satisfy the group's invariants."


_kafka_errors.kafka_errors[InvalidAssignmentError.errno] = InvalidAssignmentError
