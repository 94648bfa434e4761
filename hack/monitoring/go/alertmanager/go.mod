module ddpjob.io/monitoring/alertmanager

go 1.26.0

require github.com/prometheus/alertmanager v0.34.2
