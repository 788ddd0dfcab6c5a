"""What crosses the process boundary as text: the --session line protocol (``protocol``) and every
``BMOE_*`` record (``records``), the decide result's JSON included. Pure functions over the
runtime's and decide's result types; docs/protocol.md and docs/telemetry.md are their contract."""
