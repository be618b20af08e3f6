{{/* Common labels; selectors use only name + instance so they stay immutable across upgrades. */}}
{{- define "cfnet.labels" -}}
app.kubernetes.io/part-of: cfnet
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "cfnet.selector" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{- define "cfnet.image" -}}
{{ .root.Values.image.registry }}/cfnet-{{ .component }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* The broker's host: set explicitly, or with the clustered bus (nats.mode) its MQTT
listener (what cfnet-bus says too, which the pods' environment takes first), or this
release's Mosquitto Service. */}}
{{- define "cfnet.brokerHost" -}}
{{- if .Values.broker.host -}}
{{ .Values.broker.host }}
{{- else if eq .Values.nats.mode "deploy" -}}
nats.{{ .Release.Namespace }}.svc
{{- else if and (eq .Values.nats.mode "external") .Values.nats.external.mqttHost -}}
{{ .Values.nats.external.mqttHost }}
{{- else if .Values.mosquitto.enabled -}}
mosquitto.{{ .Release.Namespace }}.svc
{{- else -}}
{{ fail "broker.host is required when mosquitto.enabled is false" }}
{{- end -}}
{{- end }}

{{/* Where the agents connect: broker.agentHost, else the core's broker host. */}}
{{- define "cfnet.agentBrokerHost" -}}
{{- .Values.broker.agentHost | default (include "cfnet.brokerHost" .) -}}
{{- end }}

{{/* The agents' port: broker.agentPort, else the NodePort when the chart's Mosquitto is
reached through one (certNodePort for the certificate listener), else broker.certPort
(agent.identity certificate) or broker.port. */}}
{{- define "cfnet.agentBrokerPort" -}}
{{- $svc := .Values.mosquitto.service -}}
{{- $nodePort := and .Values.mosquitto.enabled .Values.broker.agentHost (eq $svc.type "NodePort") -}}
{{- if .Values.broker.agentPort -}}
{{ .Values.broker.agentPort }}
{{- else if include "cfnet.agentCertificates" . -}}
{{- if and $nodePort $svc.certNodePort -}}
{{ $svc.certNodePort }}
{{- else -}}
{{ .Values.broker.certPort }}
{{- end -}}
{{- else if and $nodePort $svc.nodePort -}}
{{ $svc.nodePort }}
{{- else -}}
{{ .Values.broker.port }}
{{- end -}}
{{- end }}

{{/* Non-empty when agents enroll for client certificates (agent.identity: certificate):
the agent ServiceAccount and CSR RBAC, the core's signer, the broker's certificate listener
(Mosquitto) or, on the chart's own NATS cluster (nats.mode deploy), the MQTT listener's
optional client-certificate check and the auth callout that names an agent by it
(nats.deploy.callout.enabled). Not with edge sites (nats.leaf): a site's leaf node has no
callout, its agents use passwords; nor with nats.mode external, whose servers the chart
does not configure. */}}
{{- define "cfnet.agentCertificates" -}}
{{- if and .Values.agent.enabled (eq .Values.agent.identity "certificate") -}}
{{- if eq .Values.nats.mode "off" -}}true
{{- else if and (eq .Values.nats.mode "deploy") .Values.nats.deploy.callout.enabled (not .Values.nats.leaf.enabled) -}}true
{{- end -}}
{{- end -}}
{{- end }}
