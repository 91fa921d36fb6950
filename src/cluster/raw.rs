//! GET, LIST and CREATE with the raw JSON the API server returned (see [`Manifest`]): unlike
//! `Api::<K>::get`, nothing k8s-openapi does not know is lost on the way in or out.

use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::{GetParams, ListParams, PostParams};
use kube::core::Request;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Cluster;
use super::error::{ClusterError, is_status, kube_err};
use crate::build::Manifest;

impl Cluster {
    /// GET one object as the raw JSON the API server returned, with its typed view (`None`
    /// when it does not exist).
    pub(crate) async fn get_raw<K>(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<Manifest<K>>, ClusterError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + k8s_openapi::Resource
            + DeserializeOwned,
    {
        // No object has an empty name (a claim target with no set to work on asks for one).
        if name.is_empty() {
            return Ok(None);
        }
        let err = kube_err(format!(
            "get {} {ns}/{name}",
            <K as k8s_openapi::Resource>::KIND
        ));
        let url = <K as Resource>::url_path(&(), Some(ns));
        let mut req = match Request::new(url).get(name, &GetParams::default()) {
            Ok(req) => req,
            Err(e) => return Err(err(kube::Error::BuildRequest(e))),
        };
        req.extensions_mut().insert("get");
        match self.client.request::<Value>(req).await {
            Ok(raw) => Ok(Some(Manifest::from_raw(raw)?)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(err(e)),
        }
    }

    /// LIST objects as the raw JSON the API server returned, each with its typed view.
    pub(crate) async fn list_raw<K>(
        &self,
        ns: &str,
        lp: &ListParams,
    ) -> Result<Vec<Manifest<K>>, ClusterError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + k8s_openapi::Resource
            + DeserializeOwned,
    {
        /// A list response, its items kept as JSON.
        #[derive(serde::Deserialize)]
        struct RawList {
            #[serde(default)]
            items: Vec<Value>,
        }
        let err = kube_err(format!(
            "list {} in {ns} ({})",
            <K as k8s_openapi::Resource>::KIND,
            lp.label_selector.as_deref().unwrap_or("all")
        ));
        let url = <K as Resource>::url_path(&(), Some(ns));
        let mut req = match Request::new(url).list(lp) {
            Ok(req) => req,
            Err(e) => return Err(err(kube::Error::BuildRequest(e))),
        };
        req.extensions_mut().insert("list");
        let list: RawList = self.client.request(req).await.map_err(err)?;
        Ok(list
            .items
            .into_iter()
            .map(Manifest::from_raw)
            .collect::<Result<_, _>>()?)
    }

    /// CREATE from raw JSON, so that nothing is dropped on the way out; an existing object of
    /// that name is a success when `exists_ok`, else an error (409, transient: the next decision
    /// looks at what is there).
    pub(crate) async fn create_raw<K>(
        &self,
        ns: &str,
        obj: &Manifest<K>,
        what: &str,
        exists_ok: bool,
    ) -> Result<(), ClusterError>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        let name = obj.raw()["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let err = kube_err(format!("create {what} {name}"));
        let body = serde_json::to_vec(obj.raw()).map_err(|e| ClusterError::Invalid {
            what: format!("{what} {name}"),
            reason: e.to_string(),
        })?;
        let url = <K as Resource>::url_path(&(), Some(ns));
        let mut req = match Request::new(url).create(&PostParams::default(), body) {
            Ok(req) => req,
            Err(e) => return Err(err(kube::Error::BuildRequest(e))),
        };
        req.extensions_mut().insert("create");
        match self.client.request::<Value>(req).await {
            Ok(_) => Ok(()),
            Err(e) if exists_ok && is_status(&e, 409) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }
}
