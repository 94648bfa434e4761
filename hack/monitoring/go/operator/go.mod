module ddpjob.io/monitoring/operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.93.0
