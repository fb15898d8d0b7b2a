"""The client side of every family on Flower: the ClientApp (``clients.client_app:app``) and what it calls.

``client_app`` finds the node's data and answers the server's messages for the family the run's
``algorithm`` picks: DP-IADMM (003; ``dpiadmm``, the protocol helpers any user's ClientApp can call),
DP-ADMM / DP-AccADMM (002; ``linadmm``), ADMM sharing (001; ``sharing``) and decentralised local-DP ADMM
(004; ``decentral``). ``gate`` checks every message against the node's own description before its values
meet the data; ``randomness`` decides on the node whether its draws are keyed (a simulation) or come from
the node's own secret (a deployment); ``runtime`` is a deployed device's own long-lived ClientApp process,
which runs the dpadmm installed on the device, never code the run's submitter ships.
"""
