# A real one-node Slurm cluster on loopback (packdata.localslurm): munged, slurmctld and slurmd run
# from build/slurm/ until `make slurm-down`. Needs Debian's packages: apt-get install slurm-wlm munge.
.PHONY: slurm-up slurm-down slurm-status

slurm-up: setup  ## start a one-node Slurm on loopback (then: export SLURM_CONF=build/slurm/slurm.conf)
	@$(BIN)/python -m packdata.localslurm up

slurm-down:  ## stop the Slurm daemons that slurm-up started
	@$(BIN)/python -m packdata.localslurm down

slurm-status:  ## which of the Slurm daemons of build/slurm/ run
	@$(BIN)/python -m packdata.localslurm status
