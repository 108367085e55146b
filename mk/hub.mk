# JupyterHub on loopback (packdata.course.localhub, scripts/hub/jupyterhub_config.py): the learners'
# path through a hub, tried on this machine. configurable-http-proxy comes from npm into build/hub/npm.
.PHONY: hub

hub: setup  ## start a JupyterHub on 127.0.0.1 (user 'learner', any password); print its URL and the nbgitpuller link
	@$(BIN)/python -m packdata.course.localhub
